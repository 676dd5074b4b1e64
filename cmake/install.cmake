# Install rules: headers, libraries, an exported CMake package (find_package(anyattn CONFIG)) and a
# pkg-config file.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/anyattn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The library targets are defined in src/; list them here (a variable set there would not reach
# this scope).
set(anyattn_install_targets)
foreach(target IN ITEMS anyattn anyattn_static)
  if(TARGET ${target})
    list(APPEND anyattn_install_targets ${target})
  endif()
endforeach()
install(TARGETS ${anyattn_install_targets} EXPORT anyattnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT anyattnTargets NAMESPACE anyattn:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/anyattn)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/anyattnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/anyattnConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/anyattn)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/anyattnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/anyattnConfig.cmake ${PROJECT_BINARY_DIR}/anyattnConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/anyattn)

# The .pc file finds its prefix from its own location (${pcfiledir}), so it stays right when the
# prefix is chosen at install time (cmake --install --prefix) or the tree is moved. Absolute
# install directories cannot be relocated and are written as they are.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ANYATTN_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(ANYATTN_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(ANYATTN_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH anyattn_pc_up "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
  string(REGEX REPLACE "/$" "" anyattn_pc_up "${anyattn_pc_up}")
  set(ANYATTN_PC_PREFIX "\${pcfiledir}/${anyattn_pc_up}")
  set(ANYATTN_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(ANYATTN_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/anyattn.pc.in ${PROJECT_BINARY_DIR}/anyattn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/anyattn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
