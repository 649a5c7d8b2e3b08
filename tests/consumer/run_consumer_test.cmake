# Installs the Loom build into a fresh prefix, then configures, builds and runs
# tests/consumer against it as a user's project would. Run by ctest with:
#   -DLOOM_BUILD_DIR= -DCONSUMER_SOURCE_DIR= -DWORK_DIR= -DCMAKE_GENERATOR= -DCXX_COMPILER=
#   -DCXX_FLAGS= (the sanitizer flags of a LOOM_SANITIZE build, which the program must share)

set(TEST_NAME "consumer test")
set(SOURCE_DIR "${CONSUMER_SOURCE_DIR}")
include(${CMAKE_CURRENT_LIST_DIR}/build_against_install.cmake)
run_step("run" "${WORK_DIR}/build/loom_consumer")
message(STATUS "${step_output}")
if(NOT step_output MATCHES "consumer ok")
  message(FATAL_ERROR "consumer test: the program did not print 'consumer ok'")
endif()
