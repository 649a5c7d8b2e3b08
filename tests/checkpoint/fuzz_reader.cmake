# The checkpoint reader fuzzed under ASan and UBSan (docs/checkpoint.md,
# "Proven"): loom_checkpoint_fuzz_asan is built from the reading path's
# sources alone (the safetensors reader, the manifest and records, the core
# they stand on), not from the uninstrumented libloom, so the suite runs it
# instrumented without a second, sanitized build of the whole library.
# Included from tests/CMakeLists.txt.

# The reading path and the part of core/ it needs; a link error here means the
# reader has grown a dependency (keep it off comm/, optim/ and parallel/).
set(_fuzz_sources
  checkpoint/crc32c.cpp
  checkpoint/reader.cpp
  checkpoint/records.cpp
  checkpoint/safetensors.cpp
  core/allocator.cpp
  core/atomic_file.cpp
  core/cpu/convert.cpp
  core/device.cpp
  core/dtype.cpp
  core/env.cpp
  core/error.cpp
  core/logging.cpp
  core/storage.cpp
  core/stream.cpp
  core/tensor.cpp
)
list(TRANSFORM _fuzz_sources PREPEND ${PROJECT_SOURCE_DIR}/src/)
add_executable(loom_checkpoint_fuzz_asan checkpoint/fuzz_reader_main.cpp ${_fuzz_sources})
# The false GCC 12 warning inside AVX-512 intrinsics that src/CMakeLists.txt
# silences for convert.cpp (source properties hold per directory).
set_source_files_properties(${PROJECT_SOURCE_DIR}/src/core/cpu/convert.cpp PROPERTIES
  COMPILE_OPTIONS "$<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized;-Wno-uninitialized>")

# Host tensors only: its own loom/config.hpp, without CUDA, ahead of the
# build's (the program does not link libloom, so nothing sees both).
set(_fuzz_config_dir ${CMAKE_CURRENT_BINARY_DIR}/checkpoint_fuzz_include)
file(READ ${PROJECT_SOURCE_DIR}/include/loom/config.hpp.in _fuzz_config)
string(REGEX REPLACE "#cmakedefine01 ([A-Z_]+)" "#define \\1 0" _fuzz_config "${_fuzz_config}")
file(CONFIGURE OUTPUT ${_fuzz_config_dir}/loom/config.hpp CONTENT "${_fuzz_config}" @ONLY)
target_include_directories(loom_checkpoint_fuzz_asan BEFORE PRIVATE ${_fuzz_config_dir})
target_include_directories(loom_checkpoint_fuzz_asan PRIVATE ${PROJECT_SOURCE_DIR}/include
                                                             ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(loom_checkpoint_fuzz_asan PRIVATE nlohmann_json::nlohmann_json
                                                        Threads::Threads)
loom_configure_target(loom_checkpoint_fuzz_asan)
# Its own sanitizers unless the build has some already (loom_configure_target
# applied LOOM_SANITIZE: one set per program; thread cannot join address).
# float-cast-overflow is not part of GCC's "undefined".
if(NOT LOOM_SANITIZE)
  set(_fuzz_sanitizers -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all)
  target_compile_options(loom_checkpoint_fuzz_asan PRIVATE ${_fuzz_sanitizers}
                                                           -fno-omit-frame-pointer -g)
  target_link_options(loom_checkpoint_fuzz_asan PRIVATE ${_fuzz_sanitizers})
endif()

# A real checkpoint to damage: tp 2 x dp 2 with ZeRO-2, written by the hidden
# test case the loom-ckpt tool test also uses (into a directory of its own,
# as that test flips a byte of its copy).
set(_fuzz_dir ${CMAKE_CURRENT_BINARY_DIR}/checkpoint_fuzz)
add_test(NAME checkpoint.reader_fuzz_fixture COMMAND loom_checkpoint_tests "[.ckpt_tool]")
set_tests_properties(checkpoint.reader_fuzz_fixture PROPERTIES TIMEOUT 120 LABELS checkpoint
                     FIXTURES_SETUP checkpoint_fuzz
                     ENVIRONMENT "LOOM_CKPT_FIXTURE_DIR=${_fuzz_dir}/checkpoints")
add_test(NAME checkpoint.reader_fuzz_asan
         COMMAND loom_checkpoint_fuzz_asan ${_fuzz_dir}/checkpoints ${_fuzz_dir}/work)
set_tests_properties(checkpoint.reader_fuzz_asan PROPERTIES TIMEOUT 120 LABELS checkpoint
                     FIXTURES_REQUIRED checkpoint_fuzz
                     ENVIRONMENT "ASAN_OPTIONS=halt_on_error=1;UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
