# One configure-time summary block: what this build of cnccl is made of.
execute_process(COMMAND ${CMAKE_COMMAND} -E env TORCH_DEVICE_BACKEND_AUTOLOAD=0 ${Python3_EXECUTABLE} -c
  "import torch; v = torch.cuda.nccl.version() if torch.version.cuda else None; print('.'.join(map(str, v)) if v else 'none')"
  OUTPUT_VARIABLE _torch_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)

set(_cpu_path "scalar")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND EXISTS /proc/cpuinfo)
  file(STRINGS /proc/cpuinfo _flags LIMIT_COUNT 1 REGEX "^flags")
  if(_flags MATCHES " avx2( |$)" AND _flags MATCHES " f16c( |$)")
    set(_cpu_path "avx2+f16c (runtime dispatch, scalar fallback)")
  endif()
endif()

if(CNCCL_WITH_CUDA)
  set(_cuda "on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES}, nccl.h ${NCCL_HEADER_VERSION})")
else()
  set(_cuda "off")
endif()

message(STATUS "")
message(STATUS "cnccl ${PROJECT_VERSION} configuration")
message(STATUS "  torch      : ${Torch_VERSION} (C++11 ABI ${TORCH_CXX11_ABI}, C++${CMAKE_CXX_STANDARD})")
message(STATUS "  CUDA       : ${_cuda}")
message(STATUS "  NCCL       : ${_torch_nccl} (loaded by torch)")
if(CNCCL_WITH_UCX)
  message(STATUS "  UCX        : ${UCX_VERSION} (the host path: shared memory within a host, UCX across hosts)")
else()
  message(STATUS "  UCX        : off (${CNCCL_NO_UCX_REASON}): no host path, CPU tensors go through gloo")
endif()
message(STATUS "  CPU codec  : ${_cpu_path}")
message(STATUS "  sanitizers : ${CNCCL_SANITIZE}")
message(STATUS "  ccache     : ${CNCCL_CCACHE}")
message(STATUS "")
