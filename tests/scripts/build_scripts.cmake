# The build's and the GPU session's scripts where they are written (no GPU):
# the offline bundle, scripts/device-check.sh, and a portable build of the
# host kernels. Included from tests/CMakeLists.txt.

# scripts/bundle-deps.sh for machines that cannot install: a probe built and
# run under mpirun from the bundle alone, the system's copies hidden in a mount
# namespace. Skipped without root or without the package archive.
add_test(NAME bundle.offline_build
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bundle/offline_build_test.sh
                 ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/bundle_work)
set_tests_properties(bundle.offline_build PROPERTIES TIMEOUT 300 LABELS "bundle;precision"
                     SKIP_RETURN_CODE 77)

# scripts/device-check.sh (a GPU session's checks as one command) where it is
# written: no GPU. It parses, refuses a bad step, skips what its budget cannot
# fit and runs the CUDA tests (skipped here) to status 0.
add_test(NAME scripts.device_check
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/device_check_test.sh ${PROJECT_SOURCE_DIR}
                 ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/device_check_work)
set_tests_properties(scripts.device_check PROPERTIES TIMEOUT 300 LABELS precision
                     PASS_REGULAR_EXPRESSION "PASS: device-check.sh")

# The host kernels compiled as a portable build (LOOM_NATIVE_ARCH=OFF,
# x86-64-v3) compiles them: the branches a -march=native AVX-512 build never
# compiles must still match their headers and leave nothing unused.
add_test(NAME build.portable_kernels
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/check_portable_build.py
                 ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
set_tests_properties(build.portable_kernels PROPERTIES TIMEOUT 300 LABELS "precision;install"
                     SKIP_RETURN_CODE 77 PROCESSORS 2)
