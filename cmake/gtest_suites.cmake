# CTest include file: one CTest test per GoogleTest suite of DSPARK_TEST_BINARY.
#
# Every test process pays libtorch's start-up (about 0.4 s on a 2-core Zen 4,
# more on slower CPUs) and loads its models once; a process per suite instead
# of per test case cuts ~600 starts from `make test`. Run at `ctest` time
# (like gtest_discover_tests' PRE_TEST mode), so new tests need no reconfigure.
# A suite's test name is the suite's GoogleTest name (e.g. `Cli`,
# `Models/LlamaCppParity`); one case: `dspark_tests --gtest_filter=Suite.Case`.
execute_process(COMMAND "${DSPARK_TEST_BINARY}" --gtest_list_tests
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE rc
                TIMEOUT 60)
if(NOT rc EQUAL 0)
  add_test(dspark_tests.list "${DSPARK_TEST_BINARY}" --gtest_list_tests)
  message(WARNING "${DSPARK_TEST_BINARY} --gtest_list_tests failed (${rc}): ${errors}")
  return()
endif()
# Keep list separators out of parameter descriptions.
string(REPLACE ";" "," listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  # Suite lines start in column 0 and end with '.', maybe with a "# TypeParam" note.
  if(line MATCHES "^([^ #][^ ]*)\\.( +#.*)?$")
    set(suite "${CMAKE_MATCH_1}")
    add_test("${suite}" "${DSPARK_TEST_BINARY}" "--gtest_filter=${suite}.*")
    set_tests_properties("${suite}" PROPERTIES
                         WORKING_DIRECTORY "${DSPARK_TEST_WORKDIR}"
                         ENVIRONMENT "GOMP_SPINCOUNT=1000")
    list(FIND DSPARK_LONG_SUITES "${suite}" long)
    if(long GREATER -1)
      set_tests_properties("${suite}" PROPERTIES COST 500)
    endif()
  endif()
endforeach()
