# GPU backend tests (engineer "gpu"), label gpu. Built whenever the CUDA backend is (CUDA and
# cuDNN found at configure time); on a machine without a GPU each device test skips with
# "no CUDA device: ..." and the error-path tests still run.
if(TARGET downpour_engine_gpu AND TARGET downpour_engine)
  downpour_add_test(gpu_agreement_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu_agreement_test.cc
    LIBS downpour_engine downpour_engine_gpu
    LABELS gpu
    TIMEOUT 600)
  downpour_add_test(gpu_training_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu_training_test.cc
    LIBS downpour_engine downpour_engine_gpu ZLIB::ZLIB
    LABELS gpu heavy
    TIMEOUT 900)
endif()
