# `cmake --install build --prefix P` (README "Install"): public headers, the static libraries a
# consumer links, the CLI, the data the CLI reads (share/kvferry: models.json, traces/), a CMake
# package (find_package(kvferry) -> kvferry::kvferry) and kvferry.pc. tests/consumer builds a
# program against an installed copy both ways (CTest `install_consumer`).
include(CMakePackageConfigHelpers)

# --- Data: installed to <datadir>/kvferry, and copied to <build>/share/kvferry so that the build
# tree's executables find it by the same rule as an installed one (src/core/data_dir.h).
set(KVFERRY_DATA_STAGE ${PROJECT_BINARY_DIR}/share/kvferry)
file(GLOB_RECURSE KVFERRY_DATA_FILES CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/data
     ${PROJECT_SOURCE_DIR}/data/*)
foreach(f ${KVFERRY_DATA_FILES})
  configure_file(${PROJECT_SOURCE_DIR}/data/${f} ${KVFERRY_DATA_STAGE}/${f} COPYONLY)
endforeach()
install(DIRECTORY ${KVFERRY_DATA_STAGE}/ DESTINATION ${CMAKE_INSTALL_DATADIR}/kvferry)

# --- The library a consumer links: the components behind the public headers (include/kvferry) and
# what they use; replay, bench, driver and logs are the CLI's. In the build tree `kvferry` stays
# everything (CLI, tests); installed, kvferry::kvferry is this target.
set(KVFERRY_LIBRARY_COMPONENTS kvferry_endpoint kvferry_metrics)
if(TARGET kvferry_manager)
  list(PREPEND KVFERRY_LIBRARY_COMPONENTS kvferry_manager)
endif()
add_library(kvferry_library INTERFACE)
target_link_libraries(kvferry_library INTERFACE ${KVFERRY_LIBRARY_COMPONENTS})
target_include_directories(kvferry_library INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set_target_properties(kvferry_library PROPERTIES EXPORT_NAME kvferry)

# Every external target a component links, as a consumer gets it: the pkg-config module (or link
# flag) for kvferry.pc and the line of kvferryConfig.cmake that defines the target. Header-only
# libraries (KVFERRY_HEADER_ONLY_LIBS, src/CMakeLists.txt) are build-only and never reach here. A
# component that links a target missing from this table stops the configure step, so the two lists
# cannot fall behind the build.
function(kvferry_external target pc cmake_line)
  string(MAKE_C_IDENTIFIER "${target}" key)
  set(KVFERRY_EXT_${key}_PC "${pc}" PARENT_SCOPE)
  set(KVFERRY_EXT_${key}_CMAKE "${cmake_line}" PARENT_SCOPE)
endfunction()
kvferry_external(Threads::Threads "-pthread" "find_dependency(Threads)")
kvferry_external(fmt::fmt fmt "find_dependency(fmt)")
kvferry_external(spdlog::spdlog spdlog "find_dependency(spdlog)")
kvferry_external(PkgConfig::UCX ucx "pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)")
kvferry_external(PkgConfig::ZMQ libzmq "pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)")
kvferry_external(PkgConfig::HTTPLIB cpp-httplib "pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)")
kvferry_external(PkgConfig::XXHASH libxxhash "pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)")
kvferry_external(PkgConfig::SODIUM libsodium "pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)")
if(KVFERRY_CUDA)
  kvferry_external(CUDA::cudart_static "-L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt"
                   "find_dependency(CUDAToolkit)")
endif()

# The components reachable from kvferry_library, in link order (each before the ones it uses:
# a depth-first post-order, reversed), and the external targets they link.
set(KVFERRY_LINK_ORDER "")
set(KVFERRY_EXTERNAL "")
function(kvferry_visit t)
  get_property(done GLOBAL PROPERTY KVFERRY_VISITED_${t} SET)
  if(done)
    return()
  endif()
  set_property(GLOBAL PROPERTY KVFERRY_VISITED_${t} TRUE)
  get_target_property(links ${t} LINK_LIBRARIES)
  if(NOT links)
    set(links "")
  endif()
  foreach(l ${links})
    string(MAKE_C_IDENTIFIER "${l}" key)
    if(l MATCHES "^\\$<BUILD_INTERFACE:")
      continue()  # header-only, build only
    elseif(l MATCHES "^kvferry_")
      kvferry_visit(${l})
    elseif(DEFINED KVFERRY_EXT_${key}_PC)
      set_property(GLOBAL APPEND PROPERTY KVFERRY_EXTERNAL_SEEN ${key})
    else()
      message(FATAL_ERROR "${t} links ${l}: add it to the external table in cmake/install.cmake "
                          "(or to KVFERRY_HEADER_ONLY_LIBS in src/CMakeLists.txt if a consumer never links it)")
    endif()
  endforeach()
  set_property(GLOBAL APPEND PROPERTY KVFERRY_POST_ORDER ${t})
endfunction()
foreach(c ${KVFERRY_LIBRARY_COMPONENTS})
  kvferry_visit(${c})
endforeach()
get_property(KVFERRY_LINK_ORDER GLOBAL PROPERTY KVFERRY_POST_ORDER)
list(REVERSE KVFERRY_LINK_ORDER)
get_property(KVFERRY_EXTERNAL GLOBAL PROPERTY KVFERRY_EXTERNAL_SEEN)
list(REMOVE_DUPLICATES KVFERRY_EXTERNAL)
list(SORT KVFERRY_EXTERNAL)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kvferry_library ${KVFERRY_LINK_ORDER} EXPORT kvferryTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kvferry_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# --- CMake package.
set(KVFERRY_FIND_DEPENDENCIES "")
foreach(e ${KVFERRY_EXTERNAL})
  string(APPEND KVFERRY_FIND_DEPENDENCIES "${KVFERRY_EXT_${e}_CMAKE}\n")
endforeach()
if(KVFERRY_FIND_DEPENDENCIES MATCHES "pkg_check_modules")
  string(PREPEND KVFERRY_FIND_DEPENDENCIES "find_dependency(PkgConfig)\n")
endif()
set(KVFERRY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvferry)
install(EXPORT kvferryTargets NAMESPACE kvferry:: DESTINATION ${KVFERRY_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvferryConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvferryConfig.cmake INSTALL_DESTINATION ${KVFERRY_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_BINDIR CMAKE_INSTALL_DATADIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvferryConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvferryConfig.cmake ${PROJECT_BINARY_DIR}/kvferryConfigVersion.cmake
        DESTINATION ${KVFERRY_CMAKE_DIR})

# --- pkg-config: the same libraries in the same order; the external ones as Requires (the
# libraries are static, so a consumer links their dependencies too).
set(KVFERRY_PC_LIBS "")
foreach(c ${KVFERRY_LINK_ORDER})
  string(REGEX REPLACE "^kvferry_" "" n ${c})
  string(APPEND KVFERRY_PC_LIBS " -lkvferry_${n}")
endforeach()
set(KVFERRY_PC_REQUIRES "")
foreach(e ${KVFERRY_EXTERNAL})
  set(v "${KVFERRY_EXT_${e}_PC}")
  if(v MATCHES "^-")
    string(APPEND KVFERRY_PC_LIBS " ${v}")
  else()
    list(APPEND KVFERRY_PC_REQUIRES ${v})
  endif()
endforeach()
list(JOIN KVFERRY_PC_REQUIRES " " KVFERRY_PC_REQUIRES)
# Relocatable: the prefix is found from the .pc file's own place, so `--prefix` at install time works.
file(RELATIVE_PATH KVFERRY_PC_PREFIX_REL /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvferry.pc.in ${PROJECT_BINARY_DIR}/kvferry.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvferry.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The Manager consumer (tests/consumer/main.cc) needs the manager component and the engine-shaped
# buffers (issue 11).
option(KVFERRY_CONSUMER_MANAGER "install_consumer also builds and runs tests/consumer/main.cc" ON)
if(NOT KVFERRY_INSTRUMENTED)
add_test(NAME install_consumer
  COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
          -DWORK_DIR=${PROJECT_BINARY_DIR}/install_consumer -DMANAGER_CONSUMER=${KVFERRY_CONSUMER_MANAGER}
          -P ${PROJECT_SOURCE_DIR}/tests/consumer/run.cmake)
set_tests_properties(install_consumer PROPERTIES TIMEOUT 300)
endif()
