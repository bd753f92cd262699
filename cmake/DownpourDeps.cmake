# Finds every dependency once, as imported targets. All are Debian 12 packages
# (scripts/bootstrap installs them); CUDA is optional.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)        # libzmq3-dev
find_package(cppzmq REQUIRED)                                  # cppzmq-dev
find_package(CapnProto REQUIRED)                               # capnproto, libcapnp-dev
# libdnnl-dev: Debian's dnnl-config.cmake demands OpenCL headers we do not use, so find the
# library directly (it is built with the OpenMP CPU runtime).
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
add_library(dnnl::dnnl UNKNOWN IMPORTED)
set_target_properties(dnnl::dnnl PROPERTIES IMPORTED_LOCATION ${DNNL_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${DNNL_INCLUDE_DIR})
find_package(OpenMP REQUIRED)
find_package(Protobuf REQUIRED)                                # libprotobuf-dev, protobuf-compiler
find_package(GTest REQUIRED)                                   # libgtest-dev
find_package(benchmark REQUIRED)                               # libbenchmark-dev
find_package(CLI11 REQUIRED)                                   # libcli11-dev
find_package(tomlplusplus REQUIRED)                            # libtomlplusplus-dev
find_package(fmt REQUIRED)                                     # libfmt-dev
find_package(spdlog REQUIRED)                                  # libspdlog-dev
find_package(ZLIB REQUIRED)                                    # zlib1g-dev (gzipped IDX files)
find_package(PNG REQUIRED)                                     # libpng-dev (contact sheets)
pkg_check_modules(TURBOJPEG REQUIRED IMPORTED_TARGET libturbojpeg)  # libturbojpeg0-dev
pkg_check_modules(DEFLATE REQUIRED IMPORTED_TARGET libdeflate)      # libdeflate-dev (CRC-32 of tensor files, logs)

find_path(LMDB_INCLUDE_DIR lmdb.h REQUIRED)                    # liblmdb-dev
find_library(LMDB_LIBRARY lmdb REQUIRED)
add_library(lmdb::lmdb UNKNOWN IMPORTED)
set_target_properties(lmdb::lmdb PROPERTIES IMPORTED_LOCATION ${LMDB_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${LMDB_INCLUDE_DIR})

# GPU backend: CUDA toolkit + cuDNN + cuBLAS. Absent => DOWNPOUR_HAVE_CUDA=0, nothing else changes.
set(DOWNPOUR_HAVE_CUDA 0)
if(DOWNPOUR_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)   # A100, H100/H200
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    if(CUDAToolkit_FOUND AND CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
      add_library(cudnn::cudnn UNKNOWN IMPORTED)
      set_target_properties(cudnn::cudnn PROPERTIES IMPORTED_LOCATION ${CUDNN_LIBRARY}
                            INTERFACE_INCLUDE_DIRECTORIES ${CUDNN_INCLUDE_DIR})
      set(DOWNPOUR_HAVE_CUDA 1)
    else()
      message(STATUS "downpour: CUDA compiler found but cuDNN/cuBLAS missing; GPU backend skipped")
    endif()
  else()
    message(STATUS "downpour: no CUDA compiler; GPU backend skipped")
  endif()
endif()

# Where the test data set lives (Debian's dataset-fashion-mnist).
set(DOWNPOUR_FASHION_MNIST_DIR /usr/share/datasets/fashion-mnist CACHE PATH "Fashion-MNIST IDX files")
