# CTest `install_consumer`: installs the build into a fresh prefix, then builds tests/consumer
# against it twice, with find_package(kvferry) and with pkg-config, and runs both programs and the
# installed CLI and the installed Python module. Arguments: -DBUILD_DIR= -DSOURCE_DIR= -DWORK_DIR=
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()


# 4. The installed Python module imports from the prefix's site dir (when the build has it).
if(EXISTS ${prefix}/lib/python3/dist-packages/kvferry/__init__.py)
  set(ENV{PYTHONPATH} ${prefix}/lib/python3/dist-packages)
  # (no `;` in the code: run() passes its arguments on as a CMake list)
  run(/usr/bin/python3 -c "print(__import__('kvferry').__file__, int(__import__('kvferry').KVPoll.Success))")
  if(NOT last_output MATCHES "^${prefix}/lib/python3/dist-packages/kvferry/__init__.py 4")
    message(FATAL_ERROR "installed Python module: ${last_output}")
  endif()
endif()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/kvferry/error.h include/kvferry/transport.h bin/kvferry)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# 1. find_package(kvferry) from the installed prefix only.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/cmake-build
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-build)
run(${WORK_DIR}/cmake-build/consumer)
message(STATUS "find_package consumer: ${last_output}")
if(NOT last_output MATCHES "^consumer ok")
  message(FATAL_ERROR "find_package consumer printed: ${last_output}")
endif()

# 2. pkg-config: the same program, compiled by hand with `pkg-config --cflags --libs kvferry`.
file(GLOB pc_dirs ${prefix}/lib*/pkgconfig ${prefix}/lib/*/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "${pc_dirs}")
run(pkg-config --cflags --libs kvferry)
string(STRIP "${last_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(c++ -O1 ${SOURCE_DIR}/tests/consumer/main.cc -o ${WORK_DIR}/consumer-pc ${flags})
run(${WORK_DIR}/consumer-pc)
message(STATUS "pkg-config consumer: ${last_output}")
if(NOT last_output MATCHES "^consumer ok")
  message(FATAL_ERROR "pkg-config consumer printed: ${last_output}")
endif()

# 3. The installed CLI runs.
run(${prefix}/bin/kvferry --help)
if(NOT last_output MATCHES "replay")
  message(FATAL_ERROR "installed CLI --help does not list replay: ${last_output}")
endif()

# 4. The installed Python module imports from the prefix's site dir (when the build has it).
if(EXISTS ${prefix}/lib/python3/dist-packages/kvferry/__init__.py)
  set(ENV{PYTHONPATH} ${prefix}/lib/python3/dist-packages)
  # (no `;` in the code: run() passes its arguments on as a CMake list)
  run(/usr/bin/python3 -c "print(__import__('kvferry').__file__, int(__import__('kvferry').KVPoll.Success))")
  if(NOT last_output MATCHES "^${prefix}/lib/python3/dist-packages/kvferry/__init__.py 4")
    message(FATAL_ERROR "installed Python module: ${last_output}")
  endif()
endif()
file(REMOVE_RECURSE ${WORK_DIR})
