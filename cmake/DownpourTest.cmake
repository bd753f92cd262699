# downpour_add_test(<name> SOURCES <files...> LIBS <targets...> [LABELS quick|heavy|gpu ...]
#                   [TIMEOUT seconds] [SERIAL])
# Builds one GoogleTest executable and registers each of its test cases with ctest,
# labelled (default: quick) and with a timeout (default 120 s) so no test hangs CI.
# SERIAL: its cases run alone (ctest RUN_SERIAL), for tests that time what the machine does and
# cannot share two cores with a parallel ctest's heavy jobs.
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
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} RUN_SERIAL ${T_SERIAL}
               ENVIRONMENT "DOWNPOUR_BUILD_DIR=${PROJECT_BINARY_DIR}")
endfunction()
