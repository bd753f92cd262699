# Tests of server/update (the update rule and learning-rate policies).
downpour_add_test(server_update_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/update_test.cc
                  LIBS downpour_server_update)
