# Installs cnccl from its build tree into a fresh prefix, then configures and builds
# examples/cpp_allreduce as a user would: against that prefix alone (find_package(cnccl) through
# CMAKE_PREFIX_PATH; torch found as the installed package says), and runs it as two processes
# sharing a FileStore. Fails unless both ranks report a correct compressed allreduce.
file(REMOVE_RECURSE ${PREFIX} ${BUILD})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${CNCCL_BUILD} --prefix ${PREFIX} RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD} -DCMAKE_PREFIX_PATH=${PREFIX} RESULT_VARIABLE rc
                OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "configuring the example against the installed prefix failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the example against the installed prefix failed")
endif()
set(store ${BUILD}/store)
file(REMOVE ${store})
execute_process(COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_ranks.sh ${BUILD}/cpp_allreduce 2 ${store}
                RESULT_VARIABLE rc TIMEOUT 300)
if(rc)
  message(FATAL_ERROR "cpp_allreduce failed: ${rc}")
endif()
