# Installation (`cmake --install BUILD --prefix P`): the public headers, libcstorch, libmodelzoo,
# cszoo, a CMake package (`find_package(cstorch)` gives cstorch::cstorch, cstorch::modelzoo and
# the program cstorch::cszoo)
# and pkg-config files (cstorch.pc, cstorch-modelzoo.pc). Everything installed is relocatable:
# the package and the .pc files find the prefix from where they lie, so a tree installed with
# one --prefix and moved still works.
set(CSTORCH_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/cstorch"
    CACHE STRING "Where the CMake package files go, relative to the prefix")
set(CSTORCH_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig"
    CACHE STRING "Where the pkg-config files go, relative to the prefix")

# RPATH: installed cszoo finds the libraries in LIBDIR beside BINDIR, libmodelzoo finds
# libcstorch beside itself. INSTALL_RPATH_USE_LINK_PATH keeps the non-system folders the
# libraries were linked from (OpenBLAS's OpenMP build, serial HDF5, Open MPI): without them the
# loader would take whichever libopenblas.so.0 the system's alternatives name, which may run its
# own pthread pool beside our OpenMP one.
file(RELATIVE_PATH _cstorch_bin_to_lib "/p/${CMAKE_INSTALL_BINDIR}" "/p/${CMAKE_INSTALL_LIBDIR}")
set_target_properties(cstorch modelzoo PROPERTIES INSTALL_RPATH "$ORIGIN"
                                                   INSTALL_RPATH_USE_LINK_PATH ON)
set_target_properties(cszoo PROPERTIES INSTALL_RPATH "$ORIGIN/${_cstorch_bin_to_lib}"
                                       INSTALL_RPATH_USE_LINK_PATH ON)
# modelzoo is exported as cstorch::modelzoo (the namespace adds the prefix).
set_target_properties(cstorch PROPERTIES EXPORT_NAME cstorch)
set_target_properties(modelzoo PROPERTIES EXPORT_NAME modelzoo)

install(TARGETS cstorch modelzoo EXPORT cstorchTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# cszoo is exported too (cstorch::cszoo): a project's build or tests can run the installed one
# by target, e.g. to train its plugin models.
set_target_properties(cszoo PROPERTIES EXPORT_NAME cszoo)
install(TARGETS cszoo EXPORT cstorchTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The data tools the guides run (docs/your-own-data.md, docs/data.md), where this build has
# them (CSTORCH_BUILD_EXAMPLES or CSTORCH_BUILD_TESTS): an installed package writes the same
# example corpora and digits as a build tree.
foreach(_tool make_text_data make_digits)
  if(TARGET ${_tool})
    set_target_properties(${_tool} PROPERTIES INSTALL_RPATH "$ORIGIN/${_cstorch_bin_to_lib}"
                                              INSTALL_RPATH_USE_LINK_PATH ON)
    # OPTIONAL: a tree built for cszoo alone (--target cszoo) still installs.
    install(TARGETS ${_tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} OPTIONAL)
  endif()
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

install(EXPORT cstorchTargets NAMESPACE cstorch:: DESTINATION ${CSTORCH_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/cstorchConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cstorchConfig.cmake INSTALL_DESTINATION ${CSTORCH_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cstorchConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cstorchConfig.cmake ${PROJECT_BINARY_DIR}/cstorchConfigVersion.cmake
  DESTINATION ${CSTORCH_INSTALL_CMAKEDIR})

# pkg-config: the prefix relative to the .pc file's folder (${pcfiledir}).
if(IS_ABSOLUTE "${CSTORCH_INSTALL_PKGCONFIGDIR}")
  set(CSTORCH_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _cstorch_pc_up "/p/${CSTORCH_INSTALL_PKGCONFIGDIR}" "/p")
  string(REGEX REPLACE "/$" "" _cstorch_pc_up "${_cstorch_pc_up}")
  set(CSTORCH_PC_PREFIX "\${pcfiledir}/${_cstorch_pc_up}")
endif()
foreach(pc cstorch cstorch-modelzoo)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/${pc}.pc.in ${PROJECT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${pc}.pc DESTINATION ${CSTORCH_INSTALL_PKGCONFIGDIR})
endforeach()
