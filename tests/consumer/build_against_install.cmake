# Included by the consumer scripts: installs the Loom build in LOOM_BUILD_DIR
# into a fresh prefix under WORK_DIR, then configures and builds the project in
# SOURCE_DIR against it as a user's project would, into WORK_DIR/build.
# Needs CMAKE_GENERATOR, CXX_COMPILER, CXX_FLAGS and TEST_NAME (for messages).

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${TEST_NAME}: ${what} failed (${status})\n${out}\n${err}")
  endif()
  message(STATUS "${TEST_NAME}: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install "${LOOM_BUILD_DIR}" --prefix "${prefix}")
run_step("configure" ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build"
         -G "${CMAKE_GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
run_step("build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
