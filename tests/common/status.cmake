downpour_add_test(common_status_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/status_test.cc LIBS downpour_common)
