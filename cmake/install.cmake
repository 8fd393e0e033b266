# `cmake --install build --prefix P` (README "Install"): public headers, the component static
# libraries, the CLI, a CMake package (find_package(kvferry) -> kvferry::kvferry) and kvferry.pc.
# tests/consumer builds a small program against an installed copy both ways (CTest
# `install_consumer`).
include(CMakePackageConfigHelpers)

get_property(KVFERRY_COMPONENT_LIBS GLOBAL PROPERTY KVFERRY_COMPONENTS)
target_include_directories(kvferry INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kvferry ${KVFERRY_COMPONENT_LIBS} EXPORT kvferryTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kvferry_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(KVFERRY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvferry)
install(EXPORT kvferryTargets NAMESPACE kvferry:: DESTINATION ${KVFERRY_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvferryConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvferryConfig.cmake INSTALL_DESTINATION ${KVFERRY_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvferryConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvferryConfig.cmake ${PROJECT_BINARY_DIR}/kvferryConfigVersion.cmake
        DESTINATION ${KVFERRY_CMAKE_DIR})

# pkg-config: the libraries in link order (a component before the ones it uses).
set(KVFERRY_PC_LIBS "")
foreach(c driver endpoint replay bootstrap transport_fault transport_ucx control core)
  string(APPEND KVFERRY_PC_LIBS " -lkvferry_${c}")
endforeach()
# Relocatable: the prefix is found from the .pc file's own place, so `--prefix` at install time works.
file(RELATIVE_PATH KVFERRY_PC_PREFIX_REL /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvferry.pc.in ${PROJECT_BINARY_DIR}/kvferry.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvferry.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

if(NOT KVFERRY_SANITIZE)
add_test(NAME install_consumer
  COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
          -DWORK_DIR=${PROJECT_BINARY_DIR}/install_consumer -P ${PROJECT_SOURCE_DIR}/tests/consumer/run.cmake)
set_tests_properties(install_consumer PROPERTIES TIMEOUT 300)
endif()
