# Worker training loop tests (engineer "train"): unit tests of its pieces (quick) and
# multi-process runs through real servers (heavy, bounded).
if(TARGET downpour_worker)
  downpour_add_test(train_units_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/train_units_test.cc
    LIBS downpour_worker)
endif()
if(TARGET downpour-worker AND TARGET downpour-server AND TARGET downpour-launch)
  downpour_add_test(train_multiprocess_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/train_multiprocess_test.cc
    LIBS downpour_common
    LABELS heavy
    TIMEOUT 170)
  add_dependencies(train_multiprocess_test downpour-worker downpour-server downpour-coordinator downpour-launch)
endif()
