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

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/kvferry/error.h include/kvferry/manager.h include/kvferry/buffers.h bin/kvferry
          share/kvferry/models.json share/kvferry/traces/conversation_trace.jsonl
          share/kvferry/traces/AzureLLMInferenceTrace_code.csv lib/pkgconfig/kvferry.pc
          lib/cmake/kvferry/kvferryConfig.cmake lib/libkvferry_core.a lib/libkvferry_endpoint.a)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
# Only the libraries behind the public headers: the CLI's own components stay in the build.
foreach(f lib/libkvferry_replay.a lib/libkvferry_bench.a lib/libkvferry_driver.a lib/libkvferry_logs.a)
  if(EXISTS ${prefix}/${f})
    message(FATAL_ERROR "installed, but no consumer links it: ${f}")
  endif()
endforeach()
# No path into the source tree is compiled into the CLI (it finds share/kvferry from its own place).
string(REGEX REPLACE "([][+.*()^$?|\\\\])" "\\\\\\1" source_re "${SOURCE_DIR}/data")
file(STRINGS ${prefix}/bin/kvferry source_paths REGEX "${source_re}")
if(source_paths)
  message(FATAL_ERROR "the installed CLI names the source tree: ${source_paths}")
endif()

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

# 3b. The installed CLI replays a bundled trace (found by name in P/share/kvferry/traces, with the
# geometry from P/share/kvferry/models.json), run from outside both trees.
unset(ENV{KVFERRY_DATA_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/elsewhere)
execute_process(COMMAND ${prefix}/bin/kvferry replay --trace conversation_trace.jsonl
                        --model Llama-3.1-8B --prefill-tp 1 --decode-tp 1 --pool-mib 256
                        --prefill-pool-mib 128 --page-size 64 --max-requests 3 --time-scale 0
                        --progress off --out ${WORK_DIR}/elsewhere/replay
                WORKING_DIRECTORY ${WORK_DIR}/elsewhere RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK_DIR}/elsewhere/replay/report.json)
  message(FATAL_ERROR "installed kvferry replay failed (${rc}):\n${out}\n${err}")
endif()
file(READ ${WORK_DIR}/elsewhere/replay/report.json report)
string(JSON models_file GET "${report}" config models_file)
if(NOT models_file STREQUAL "${prefix}/share/kvferry/models.json")
  message(FATAL_ERROR "the installed replay read its geometry from ${models_file}")
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
