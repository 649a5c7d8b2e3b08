# Installs the Loom build into a fresh prefix, builds docs/getting-started
# against it as a user's project, and runs tests/consumer/check_guide.py.
# Run by ctest with: -DLOOM_BUILD_DIR= -DGUIDE_DIR= -DGUIDE_MD= -DWORK_DIR=
#   -DCMAKE_GENERATOR= -DCXX_COMPILER= -DCXX_FLAGS= -DPYTHON= -DCHECK= -DMPIRUN= -DDIGITS=

set(TEST_NAME "getting-started test")
set(SOURCE_DIR "${GUIDE_DIR}")
include(${CMAKE_CURRENT_LIST_DIR}/build_against_install.cmake)
execute_process(COMMAND "${PYTHON}" "${CHECK}" "${GUIDE_MD}" "${GUIDE_DIR}/train_digits.cpp"
                        "${WORK_DIR}/build/train_digits" "${MPIRUN}" "${DIGITS}" "${WORK_DIR}/run"
                RESULT_VARIABLE status)
if(status EQUAL 77)
  message(STATUS "LOOM_SKIP: the digits dataset is missing")
  # ctest sees the skip through the test's SKIP_REGULAR_EXPRESSION.
elseif(NOT status EQUAL 0)
  message(FATAL_ERROR "getting-started test: check_guide.py failed (${status})")
endif()
