# Compiler warnings, the CPU architecture flag and sanitizers, applied per target
# with loom_configure_target(<target>) so that third-party code is unaffected.

set(_loom_sanitizers "")
set(LOOM_SANITIZER_ENV "")
if(LOOM_SANITIZE)
  string(REPLACE "," ";" _loom_san_list "${LOOM_SANITIZE}")
  foreach(s IN LISTS _loom_san_list)
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "LOOM_SANITIZE='${LOOM_SANITIZE}': '${s}' is not one of address, undefined, thread")
    endif()
  endforeach()
  if("thread" IN_LIST _loom_san_list AND "address" IN_LIST _loom_san_list)
    message(FATAL_ERROR "LOOM_SANITIZE='${LOOM_SANITIZE}': thread and address sanitizers cannot be combined")
  endif()
  # -fno-sanitize-recover: undefined behaviour aborts, so a test that hits it fails.
  set(_loom_sanitizers "-fsanitize=${LOOM_SANITIZE}" "-fno-sanitize-recover=all")
  # For tests and benchmark smoke tests: Open MPI keeps MPI_Init's allocations
  # until exit on purpose; its components are dlopen'd, so unwind fully.
  # Under ThreadSanitizer (no leak checking), its own suppressions instead.
  if("thread" IN_LIST _loom_san_list)
    set(LOOM_SANITIZER_ENV
        "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan.supp:print_suppressions=0")
  else()
    set(LOOM_SANITIZER_ENV
        "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/sanitizers/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0")
  endif()
endif()

# NOTE [slp miscompile]: GCC 12.2 with AVX-512 enabled (-march=native on an
# AVX-512 CPU) builds some constant vectors wrongly in its SLP vectorizer
# (std::vector<double>{2, 2, 2, 0} holds four 2s; cmake/checks/). Where the
# check program shows it, the SLP vectorizer is switched off for Loom's code.
set(LOOM_SLP_WORKAROUND OFF)
if(LOOM_NATIVE_ARCH AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT CMAKE_CROSSCOMPILING)
  try_run(_loom_slp_run _loom_slp_compiled ${CMAKE_BINARY_DIR}/loom_checks/slp
          ${PROJECT_SOURCE_DIR}/cmake/checks/slp_constant_vector.cpp
          COMPILE_DEFINITIONS -O2 -march=native CXX_STANDARD 20)
  if(_loom_slp_compiled AND NOT _loom_slp_run EQUAL 0)
    set(LOOM_SLP_WORKAROUND ON)
    message(STATUS "Loom: ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} miscompiles "
                   "constant vectors with -march=native (cmake/checks/slp_constant_vector.cpp); "
                   "building with -fno-tree-slp-vectorize")
  endif()
endif()

function(loom_configure_target target)
  set(cxx_flags -Wall -Wextra -Wno-unused-parameter)
  if(LOOM_WERROR)
    list(APPEND cxx_flags -Werror)
  endif()
  if(LOOM_NATIVE_ARCH)
    list(APPEND cxx_flags -march=native)
  endif()
  if(LOOM_SLP_WORKAROUND)  # NOTE [slp miscompile]
    list(APPEND cxx_flags -fno-tree-slp-vectorize)
  endif()
  if(_loom_sanitizers)
    list(APPEND cxx_flags ${_loom_sanitizers} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE ${_loom_sanitizers})
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX,C>:${cxx_flags}>)
  # Loom uses MPI's C API only; keep the deprecated C++ bindings out of mpi.h.
  target_compile_definitions(${target} PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  if(LOOM_HAS_CUDA)
    # Host-side warnings for .cu files go through nvcc to the host compiler.
    string(REPLACE ";" "," host_flags "-Wall;-Wextra;-Wno-unused-parameter")
    if(LOOM_NATIVE_ARCH)
      string(APPEND host_flags ",-march=native")
    endif()
    if(LOOM_SLP_WORKAROUND)
      string(APPEND host_flags ",-fno-tree-slp-vectorize")
    endif()
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${host_flags} --expt-relaxed-constexpr>)
  endif()
endfunction()
