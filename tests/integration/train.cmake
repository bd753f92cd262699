# Worker training loop tests (engineer "train"): unit tests of its pieces (quick) and
# multi-process runs through real servers (heavy, bounded).
if(TARGET downpour_worker)
  downpour_add_test(train_units_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/train_units_test.cc
    LIBS downpour_worker)
endif()
