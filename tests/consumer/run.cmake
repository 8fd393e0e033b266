# CTest `install_consumer`: installs the build into a fresh prefix, checks what it holds, builds the
# programs of tests/consumer against it twice, with find_package(kvferry) and with pkg-config, runs
# them, runs the installed CLI's replay from outside both trees and imports the installed Python
# module. Arguments: -DBUILD_DIR= -DSOURCE_DIR= -DWORK_DIR= [-DMANAGER_CONSUMER=ON]
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

# The programs: basics.cc always; main.cc (the Manager consumer) with -DMANAGER_CONSUMER=ON.
set(programs basics)
set(manager_flag OFF)
if(MANAGER_CONSUMER)
  list(APPEND programs main)
  set(manager_flag ON)
endif()

# 1. find_package(kvferry) from the installed prefix only.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/cmake-build
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DKVFERRY_CONSUMER_MANAGER=${manager_flag})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-build)
# 2. pkg-config: the same programs, compiled by hand with `pkg-config --cflags --libs kvferry`.
file(GLOB pc_dirs ${prefix}/lib*/pkgconfig ${prefix}/lib/*/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "${pc_dirs}")
run(pkg-config --cflags --libs kvferry)
string(STRIP "${last_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
foreach(p ${programs})
  if(p STREQUAL "main")
    set(cmake_exe ${WORK_DIR}/cmake-build/consumer)
  else()
    set(cmake_exe ${WORK_DIR}/cmake-build/consumer_${p})
  endif()
  run(c++ -O1 ${SOURCE_DIR}/tests/consumer/${p}.cc -o ${WORK_DIR}/consumer-pc-${p} ${flags})
  foreach(exe ${cmake_exe} ${WORK_DIR}/consumer-pc-${p})
    run(${exe})
    message(STATUS "${exe}: ${last_output}")
    if(NOT last_output MATCHES "^consumer ok")
      message(FATAL_ERROR "${exe} printed: ${last_output}")
    endif()
  endforeach()
endforeach()

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
