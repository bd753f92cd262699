# Tests of the wire part of common/: layout, codec, transports.
downpour_add_test(wire_layout_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/wire_layout_test.cc
                  LIBS downpour_common)
downpour_add_test(wire_codec_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/wire_codec_test.cc
                  LIBS downpour_common)
downpour_add_test(wire_transport_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/wire_transport_test.cc
                  LIBS downpour_common)
