# Shard server tests (in-process transport): update math, validation, consistency, checkpoints.
downpour_add_test(shard_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/shard_test.cc
                  LIBS downpour_server downpour_ps_client)
