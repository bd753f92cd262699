# Multi-process parameter-service tests: the real downpour-server / downpour-coordinator
# binaries over loopback TCP (ports chosen by the OS).
downpour_add_test(ps_multiprocess_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/ps_multiprocess_test.cc
                  LIBS downpour_ps_client LABELS heavy TIMEOUT 120)
add_dependencies(ps_multiprocess_test downpour-server downpour-coordinator)
target_compile_definitions(ps_multiprocess_test PRIVATE
    DOWNPOUR_SERVER_BIN="$<TARGET_FILE:downpour-server>"
    DOWNPOUR_COORDINATOR_BIN="$<TARGET_FILE:downpour-coordinator>")
