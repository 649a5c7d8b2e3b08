# Installs libloom, its public headers and a CMake package so that a user's
# project can do:  find_package(Loom REQUIRED)  target_link_libraries(app loom::loom)

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(LOOM_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/Loom")

install(TARGETS loom EXPORT LoomTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/loom DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} PATTERN "*.in" EXCLUDE)
install(FILES "${PROJECT_BINARY_DIR}/include/loom/config.hpp"
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loom)
install(EXPORT LoomTargets NAMESPACE loom:: DESTINATION ${LOOM_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/LoomConfig.cmake.in
  "${PROJECT_BINARY_DIR}/LoomConfig.cmake" INSTALL_DESTINATION ${LOOM_INSTALL_CMAKEDIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/LoomConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/LoomConfig.cmake" "${PROJECT_BINARY_DIR}/LoomConfigVersion.cmake"
        DESTINATION ${LOOM_INSTALL_CMAKEDIR})
