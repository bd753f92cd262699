# Shard server tests (in-process transport): update math, validation, consistency, checkpoints.
downpour_add_test(shard_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/shard_test.cc
                  LIBS downpour_server downpour_ps_client)
# Coordinator membership (inproc): finished workers gone at once, silent ones after the timeout.
downpour_add_test(coordinator_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/coordinator_test.cc
                  LIBS downpour_server)
