# Parameter-service client tests (in-process transport against real shard servers).
downpour_add_test(ps_client_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/ps_client_test.cc
                  LIBS downpour_ps_client downpour_server)
