# downpour_add_test(<name> SOURCES <files...> LIBS <targets...> [LABELS quick|heavy|gpu ...]
#                   [TIMEOUT seconds] [SERIAL])
# Builds one GoogleTest executable and registers each of its test cases with ctest,
# labelled (default: quick) and with a timeout (default 120 s) so no test hangs CI.
# SERIAL: its cases run alone (ctest RUN_SERIAL), for tests that time what the machine does and
# cannot share two cores with a parallel ctest's heavy jobs.
#
# Test sources build at -O1 and share one precompiled header (downpour_test_pch, below): the
# test files were a large part of a clean build, most of it -O3 on gtest's macros and
# re-parsing the same headers. The code under test is the libraries, which keep the
# build type's flags (-O3 in Release).
set(DOWNPOUR_TEST_CXX_FLAGS -O1)

# downpour_add_test_pch(): the targets whose precompiled headers the tests reuse. Call once,
# before the first downpour_add_test. Each links what the tests link (downpour_common's
# definitions and include paths, GTest), so its header fits them; GCC uses a header only where
# the predefined macros match, so tests compiled with OpenMP (the engine's) get a second one. A
# test neither fits still compiles, parsing the headers itself (-Winvalid-pch says so).
function(downpour_add_test_pch)
  foreach(variant plain omp)
    set(host downpour_test_pch)
    if(variant STREQUAL "omp")
      set(host downpour_test_pch_omp)
    endif()
    # Executables, as the tests are: a library's header would be built -fPIC, which GCC
    # refuses to use in -fPIE code.
    add_executable(${host} ${PROJECT_SOURCE_DIR}/tests/testing/pch_host.cc)
    target_link_libraries(${host} PRIVATE downpour_common GTest::gtest GTest::gmock)
    if(variant STREQUAL "omp")
      target_link_libraries(${host} PRIVATE OpenMP::OpenMP_CXX)
    endif()
    target_compile_options(${host} PRIVATE ${DOWNPOUR_TEST_CXX_FLAGS})
    target_precompile_headers(${host} PRIVATE
      <gtest/gtest.h> <gmock/gmock.h> <fmt/format.h> <spdlog/spdlog.h>
      <algorithm> <atomic> <chrono> <cmath> <cstdint> <cstring> <filesystem> <fstream> <functional>
      <map> <memory> <mutex> <random> <set> <sstream> <string> <thread> <unordered_map> <vector>)
  endforeach()
endfunction()

# Sets `out` to TRUE when linking `libs` compiles with OpenMP (OpenMP::OpenMP_CXX among their
# public, transitive usage requirements).
function(downpour_links_openmp out)
  set(todo ${ARGN})
  set(seen "")
  while(todo)
    list(POP_FRONT todo lib)
    if(lib STREQUAL "OpenMP::OpenMP_CXX")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    if(lib IN_LIST seen OR lib MATCHES "^\\$<" OR NOT TARGET ${lib})
      continue()
    endif()
    list(APPEND seen ${lib})
    get_target_property(deps ${lib} INTERFACE_LINK_LIBRARIES)
    if(deps)
      list(APPEND todo ${deps})
    endif()
  endwhile()
  set(${out} FALSE PARENT_SCOPE)
endfunction()

function(downpour_add_test name)
  cmake_parse_arguments(T "SERIAL" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_LABELS)
    set(T_LABELS quick)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_options(${name} PRIVATE ${DOWNPOUR_TEST_CXX_FLAGS})
  downpour_links_openmp(openmp ${T_LIBS})
  if(openmp)
    target_precompile_headers(${name} REUSE_FROM downpour_test_pch_omp)
  else()
    target_precompile_headers(${name} REUSE_FROM downpour_test_pch)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} RUN_SERIAL ${T_SERIAL}
               ENVIRONMENT "DOWNPOUR_BUILD_DIR=${PROJECT_BINARY_DIR}")
endfunction()
