# Tests of the data module (LMDB format, converters, shards, loader).
downpour_add_test(data_idx_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/idx_test.cc
  LIBS downpour_data ZLIB::ZLIB
  LABELS quick TIMEOUT 60)
downpour_add_test(data_datum_compat_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/datum_compat_test.cc
  LIBS downpour_data ZLIB::ZLIB
  LABELS quick TIMEOUT 60)
downpour_add_test(data_convert_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/convert_test.cc
  LIBS downpour_data ZLIB::ZLIB
  LABELS quick TIMEOUT 60)
downpour_add_test(data_loader_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/loader_test.cc
  LIBS downpour_data ZLIB::ZLIB
  LABELS quick TIMEOUT 60)
downpour_add_test(data_cli_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/cli_test.cc
  LIBS downpour_data ZLIB::ZLIB
  LABELS quick TIMEOUT 60)
add_dependencies(data_cli_test downpour-data)
