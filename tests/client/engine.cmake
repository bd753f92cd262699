# Engine tests (engineer "engine"): parser/shape inference, gradient checks, oneDNN vs
# reference agreement, and the Fashion-MNIST learning test (heavy).
if(TARGET downpour_engine)
  downpour_add_test(engine_spec_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/engine_spec_test.cc
    LIBS downpour_engine)
endif()
downpour_add_test(engine_gradcheck_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/engine_gradcheck_test.cc
  LIBS downpour_engine_core)
if(TARGET downpour_engine)
  downpour_add_test(engine_agreement_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/engine_agreement_test.cc
    LIBS downpour_engine)
endif()
# The learning test needs the IDX reader (data) and the servers' update rule (server/update).
if(TARGET downpour_engine AND TARGET downpour_data AND TARGET downpour_server_update)
  downpour_add_test(engine_learning_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/engine_learning_test.cc
    LIBS downpour_engine downpour_data downpour_server_update
    LABELS heavy
    TIMEOUT 600)
endif()
if(TARGET downpour_engine)
  downpour_add_test(engine_weights_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/engine_weights_test.cc
    LIBS downpour_engine)
endif()
if(TARGET downpour_engine)
  downpour_add_test(engine_timer_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/engine_timer_test.cc
    LIBS downpour_engine)
endif()
