# Installs the Loom build into a fresh prefix, then configures, builds and runs
# tests/consumer against it as a user's project would. Run by ctest with:
#   -DLOOM_BUILD_DIR= -DCONSUMER_SOURCE_DIR= -DWORK_DIR= -DCMAKE_GENERATOR= -DCXX_COMPILER=
#   -DCXX_FLAGS= (the sanitizer flags of a LOOM_SANITIZE build, which the program must share)

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "consumer test: ${what} failed (${status})\n${out}\n${err}")
  endif()
  message(STATUS "consumer test: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install "${LOOM_BUILD_DIR}" --prefix "${prefix}")
run_step("configure" ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build"
         -G "${CMAKE_GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
run_step("build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_step("run" "${WORK_DIR}/build/loom_consumer")
message(STATUS "${step_output}")
if(NOT step_output MATCHES "consumer ok")
  message(FATAL_ERROR "consumer test: the program did not print 'consumer ok'")
endif()
