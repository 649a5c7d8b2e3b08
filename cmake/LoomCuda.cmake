# Resolves the requests LOOM_WITH_CUDA and LOOM_WITH_NCCL (AUTO/ON/OFF) into
# the plain variables LOOM_HAS_CUDA and LOOM_HAS_NCCL (ON/OFF), leaving the
# cached requests untouched so that AUTO stays AUTO on reconfigure. When CUDA
# is on it enables the CUDA language, finds the toolkit (CUDA::cudart,
# CUDA::cublas, CUDA::cublasLt, CUDA::nvtx3) and locates cuDNN and NCCL
# (LOOM_CUDNN_LIBRARY / LOOM_CUDNN_INCLUDE_DIR, LOOM_NCCL_LIBRARY /
# LOOM_NCCL_INCLUDE_DIR). Those two are linked by path so that the exported
# package does not depend on targets defined here.

include(CheckLanguage)

function(_loom_resolve_switch name value)
  string(TOUPPER "${value}" upper)
  if(NOT upper MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
    message(FATAL_ERROR "${name}='${value}' must be AUTO, ON or OFF")
  endif()
  set(${name}_REQUEST "${upper}" PARENT_SCOPE)
endfunction()

_loom_resolve_switch(LOOM_WITH_CUDA "${LOOM_WITH_CUDA}")
_loom_resolve_switch(LOOM_WITH_NCCL "${LOOM_WITH_NCCL}")

# nvcc is often installed under /usr/local/cuda without being on PATH (CI, sudo).
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(_loom_nvcc nvcc HINTS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)
  if(_loom_nvcc)
    set(CMAKE_CUDA_COMPILER "${_loom_nvcc}" CACHE FILEPATH "CUDA compiler")
  endif()
endif()

set(_loom_cuda OFF)
if(LOOM_WITH_CUDA_REQUEST MATCHES "^(AUTO|ON|TRUE|YES|1)$")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_loom_cuda ON)
  elseif(LOOM_WITH_CUDA_REQUEST STREQUAL "AUTO")
    message(STATUS "Loom: no CUDA compiler found; building without CUDA (LOOM_WITH_CUDA=AUTO)")
  else()
    message(FATAL_ERROR "LOOM_WITH_CUDA=ON but no CUDA compiler (nvcc) was found; "
                        "set CMAKE_CUDA_COMPILER or CUDA_HOME")
  endif()
endif()

if(_loom_cuda)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # A100 and H100 (sm_90 also runs on H200). Override with -DCMAKE_CUDA_ARCHITECTURES=...
    set(CMAKE_CUDA_ARCHITECTURES 80 90 CACHE STRING "CUDA architectures to build for")
  endif()
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag (nvcc has had -std=c++20 since CUDA 12.0).
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)

  set(_loom_cuda_hints ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64)
  set(_loom_cuda_inc_hints ${CUDAToolkit_INCLUDE_DIRS})

  # CUDNN_ROOT / NCCL_ROOT name a separate install: a tarball, or the
  # nvidia-cudnn-* / nvidia-nccl-* Python wheels (site-packages/nvidia/cudnn),
  # which ship only the versioned library (libcudnn.so.9, libnccl.so.2).
  find_path(LOOM_CUDNN_INCLUDE_DIR cudnn.h HINTS $ENV{CUDNN_ROOT}/include ${_loom_cuda_inc_hints})
  find_library(LOOM_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR
               HINTS $ENV{CUDNN_ROOT}/lib $ENV{CUDNN_ROOT}/lib64 ${_loom_cuda_hints})
  if(NOT LOOM_CUDNN_INCLUDE_DIR OR NOT LOOM_CUDNN_LIBRARY)
    message(FATAL_ERROR "CUDA is enabled but cuDNN (cudnn.h, libcudnn) was not found; "
                        "install cuDNN or configure with -DLOOM_WITH_CUDA=OFF")
  endif()

  if(LOOM_WITH_NCCL_REQUEST MATCHES "^(AUTO|ON|TRUE|YES|1)$")
    find_path(LOOM_NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_ROOT}/include ${_loom_cuda_inc_hints})
    find_library(LOOM_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
                 HINTS $ENV{NCCL_ROOT}/lib $ENV{NCCL_ROOT}/lib64 ${_loom_cuda_hints})
    if(LOOM_NCCL_INCLUDE_DIR AND LOOM_NCCL_LIBRARY)
      set(LOOM_HAS_NCCL ON)
    elseif(LOOM_WITH_NCCL_REQUEST STREQUAL "AUTO")
      message(STATUS "Loom: NCCL not found; building without NCCL (LOOM_WITH_NCCL=AUTO)")
      set(LOOM_HAS_NCCL OFF)
    else()
      message(FATAL_ERROR "LOOM_WITH_NCCL=ON but nccl.h / libnccl were not found")
    endif()
  else()
    set(LOOM_HAS_NCCL OFF)
  endif()
  set(LOOM_HAS_CUDA ON)
else()
  if(LOOM_WITH_NCCL_REQUEST MATCHES "^(ON|TRUE|YES|1)$")
    message(FATAL_ERROR "LOOM_WITH_NCCL=ON requires CUDA (LOOM_WITH_CUDA resolved to OFF)")
  endif()
  set(LOOM_HAS_CUDA OFF)
  set(LOOM_HAS_NCCL OFF)
endif()
