# Test registration shared by tests/, bench/ and examples/.
#
# Multi-process tests run under mpirun with --oversubscribe. Each declares the
# cores it occupies (PROCESSORS = ranks; ctest caps it at its -j level), so
# `ctest -j2` on a 2-core machine never runs a 2- or 4-rank job beside another
# test: their timeouts are short and their timing is not meant to compete.
# Running as root needs Open MPI's consent; LOOM_COMM_TIMEOUT keeps a broken
# test from hanging until ctest's TIMEOUT.

set(LOOM_MPI_TEST_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
                      LOOM_COMM_TIMEOUT=60s)
if(LOOM_SANITIZE)
  list(APPEND LOOM_MPI_TEST_ENV "${LOOM_SANITIZER_ENV}")
endif()

# loom_mpi_test(NAME <name> NP <ranks> TIMEOUT <s> [LABELS ...] [ENVIRONMENT ...]
#               [SKIP_RETURN_CODE <code>] COMMAND <program> [args...])
# Runs `mpirun -np <ranks> --oversubscribe <program> args...` with the label
# `mpi` added and LOOM_MPI_TEST_ENV in its environment.
function(loom_mpi_test)
  cmake_parse_arguments(T "" "NAME;NP;TIMEOUT;SKIP_RETURN_CODE" "LABELS;ENVIRONMENT;COMMAND" ${ARGN})
  if(NOT T_NAME OR NOT T_NP OR NOT T_TIMEOUT OR NOT T_COMMAND)
    message(FATAL_ERROR "loom_mpi_test: NAME, NP, TIMEOUT and COMMAND are required")
  endif()
  add_test(NAME ${T_NAME}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_NP} --oversubscribe ${T_COMMAND})
  set(labels mpi ${T_LABELS})
  list(REMOVE_DUPLICATES labels)
  set(environment ${LOOM_MPI_TEST_ENV} ${T_ENVIRONMENT})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} PROCESSORS ${T_NP}
                       LABELS "${labels}" ENVIRONMENT "${environment}")
  if(T_SKIP_RETURN_CODE)
    set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE ${T_SKIP_RETURN_CODE})
  endif()
endfunction()
