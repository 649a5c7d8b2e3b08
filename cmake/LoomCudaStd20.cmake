# Included by enable_language(CUDA) (as CMAKE_USER_MAKE_RULES_OVERRIDE_CUDA) right
# after CMake's own rules for the CUDA compiler. CMake releases before 3.26 do not
# know how to ask nvcc for C++20, so every target with cxx_std_20 and CUDA sources
# fails to generate ("requires the language dialect CUDA20"). nvcc has accepted
# -std=c++20 since CUDA 12.0; tell CMake so when it did not know.
if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
   AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0
   AND NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
