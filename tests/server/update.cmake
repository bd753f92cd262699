# Tests of server/update (the update rule and learning-rate policies).
downpour_add_test(server_update_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/update_test.cc
                  LIBS downpour_server_update)
# downpour-launch end to end, with /bin/sh stand-ins for the other binaries.
downpour_add_test(server_update_launch_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/update_launch_test.cc
                  LIBS downpour_common TIMEOUT 90)
target_compile_definitions(server_update_launch_test PRIVATE
                           DOWNPOUR_LAUNCH_BIN="$<TARGET_FILE:downpour-launch>")
add_dependencies(server_update_launch_test downpour-launch)
