# Configures and builds examples/cpp_allreduce against the cnccl build tree, then runs it as two
# processes sharing a FileStore; fails unless both ranks report a correct compressed allreduce.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD} -Dcnccl_DIR=${cnccl_DIR} RESULT_VARIABLE rc
                OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "configuring the example failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the example failed")
endif()
set(store ${BUILD}/store)
file(REMOVE ${store})
execute_process(COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_ranks.sh ${BUILD}/cpp_allreduce 2 ${store}
                RESULT_VARIABLE rc TIMEOUT 300)
if(rc)
  message(FATAL_ERROR "cpp_allreduce failed: ${rc}")
endif()
