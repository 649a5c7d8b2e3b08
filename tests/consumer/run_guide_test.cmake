# Installs the Loom build into a fresh prefix, builds docs/getting-started
# against it as a user's project, and runs tests/consumer/check_guide.py.
# Run by ctest with: -DLOOM_BUILD_DIR= -DGUIDE_DIR= -DGUIDE_MD= -DWORK_DIR=
#   -DCMAKE_GENERATOR= -DCXX_COMPILER= -DCXX_FLAGS= -DPYTHON= -DCHECK= -DMPIRUN= -DDIGITS=

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "getting-started test: ${what} failed (${status})\n${out}\n${err}")
  endif()
  message(STATUS "getting-started test: ${what}: ok")
endfunction()

run_step("install" ${CMAKE_COMMAND} --install "${LOOM_BUILD_DIR}" --prefix "${prefix}")
run_step("configure" ${CMAKE_COMMAND} -S "${GUIDE_DIR}" -B "${WORK_DIR}/build"
         -G "${CMAKE_GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
run_step("build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
execute_process(COMMAND "${PYTHON}" "${CHECK}" "${GUIDE_MD}" "${GUIDE_DIR}/train_digits.cpp"
                        "${WORK_DIR}/build/train_digits" "${MPIRUN}" "${DIGITS}" "${WORK_DIR}/run"
                RESULT_VARIABLE status)
if(status EQUAL 77)
  message(STATUS "LOOM_SKIP: the digits dataset is missing")
  # ctest sees the skip through the test's SKIP_REGULAR_EXPRESSION.
elseif(NOT status EQUAL 0)
  message(FATAL_ERROR "getting-started test: check_guide.py failed (${status})")
endif()
