# CMake helpers for the example programs' multi-rank tests (included from
# tests/CMakeLists.txt inside if(LOOM_BUILD_EXAMPLES)).
#
# loom_compare_runs(PROGRAM target NAME prefix [ACCUMULATE] [RESOURCE_LOCK path]
#                   [SKIP_REGULAR_EXPRESSION re] [RTOL r] [LABELS label...]
#                   [ENVIRONMENT VAR=value...] COMMON arg...
#                   CASES "np|extra args|layout flags" ...):
# per case, `mpirun -np NP PROGRAM COMMON EXTRA LAYOUT` against one rank on the
# same global batch (tests/support/compare_train_runs.py; ACCUMULATE: the one
# rank runs the same micro-batches one after another; RTOL: the relative part
# of the tolerance, 1e-4 by default). The test is named
# PREFIX_npNP<layout flags>, labelled examples, mpi and LABELS.
function(loom_compare_runs)
  cmake_parse_arguments(A "ACCUMULATE" "PROGRAM;NAME;RESOURCE_LOCK;SKIP_REGULAR_EXPRESSION;RTOL"
                        "LABELS;ENVIRONMENT;COMMON;CASES" ${ARGN})
  set(accumulate)
  if(A_ACCUMULATE)
    set(accumulate --accumulate)
  endif()
  if(A_RTOL)
    list(APPEND accumulate --rtol ${A_RTOL})
  endif()
  foreach(case IN LISTS A_CASES)
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 np)
    list(GET parts 1 extra)
    list(GET parts 2 flags)
    string(REGEX REPLACE "[-, ]+" "_" name "${A_NAME}_np${np}${flags}")
    separate_arguments(extra)
    add_test(NAME ${name}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/support/compare_train_runs.py
                     ${accumulate} ${MPIEXEC_EXECUTABLE} ${np} $<TARGET_FILE:${A_PROGRAM}>
                     --layout "${flags}" -- ${A_COMMON} ${extra})
    set_tests_properties(${name} PROPERTIES TIMEOUT 300 PROCESSORS ${np}
                         LABELS "examples;mpi;${A_LABELS}" ENVIRONMENT "${LOOM_MPI_TEST_ENV}")
    if(A_ENVIRONMENT)
      set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT ${A_ENVIRONMENT})
    endif()
    if(A_RESOURCE_LOCK)
      set_tests_properties(${name} PROPERTIES RESOURCE_LOCK ${A_RESOURCE_LOCK})
    endif()
    if(A_SKIP_REGULAR_EXPRESSION)
      set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "${A_SKIP_REGULAR_EXPRESSION}")
    endif()
  endforeach()
endfunction()

# loom_refuses_runs(PROGRAM target NAME prefix [LABELS label...] COMMON arg...
#                   CASES "np|flags|expected message" ...):
# per case, `mpirun -np NP PROGRAM COMMON FLAGS` must print the message (flags
# the model or the world cannot take, refused before any communication).
function(loom_refuses_runs)
  cmake_parse_arguments(A "" "PROGRAM;NAME" "LABELS;COMMON;CASES" ${ARGN})
  foreach(case IN LISTS A_CASES)
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 np)
    list(GET parts 1 flags)
    list(GET parts 2 message)
    string(REGEX REPLACE "[-, ]+" "_" name "${A_NAME}_np${np}${flags}")
    separate_arguments(flags)
    add_test(NAME ${name}
             COMMAND ${MPIEXEC_EXECUTABLE} -np ${np} --oversubscribe $<TARGET_FILE:${A_PROGRAM}>
                     ${A_COMMON} ${flags})
    set_tests_properties(${name} PROPERTIES TIMEOUT 60 PROCESSORS ${np}
                         LABELS "examples;mpi;${A_LABELS}" ENVIRONMENT "${LOOM_MPI_TEST_ENV}"
                         PASS_REGULAR_EXPRESSION "${message}")
  endforeach()
endfunction()
