# Tests of the "update" part of common/: run config, tensor files, metrics, process group.
downpour_add_test(common_run_config_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/run_config_test.cc
                  LIBS downpour_common)
downpour_add_test(common_tensor_file_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tensor_file_test.cc
                  LIBS downpour_common)
downpour_add_test(common_metrics_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/metrics_test.cc
                  LIBS downpour_common)
downpour_add_test(common_process_group_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/process_group_test.cc
                  LIBS downpour_common TIMEOUT 60)
