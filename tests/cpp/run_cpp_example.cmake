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
execute_process(
  COMMAND ${BUILD}/cpp_allreduce 0 2 ${store}
  COMMAND ${BUILD}/cpp_allreduce 1 2 ${store}
  RESULTS_VARIABLE codes TIMEOUT 300)
message(STATUS "exit codes: ${codes}")
if(NOT codes STREQUAL "0;0")
  message(FATAL_ERROR "cpp_allreduce failed: ${codes}")
endif()
