# Finds libtorch inside the installed Python package (pip's torch), never a downloaded libtorch.
# Sets Torch_VERSION, TORCH_CUDA_BUILD, TORCH_CXX11_ABI, TORCH_PYTHON_LIBRARY, Python3_* and the
# `torch` imported targets from torch's own TorchConfig.cmake.
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)

execute_process(
  COMMAND ${CMAKE_COMMAND} -E env TORCH_DEVICE_BACKEND_AUTOLOAD=0 ${Python3_EXECUTABLE} -c
    "import torch, os; print(torch.utils.cmake_prefix_path); print(torch.__version__.split('+')[0]); print(int(torch.version.cuda is not None)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "torch is not importable by ${Python3_EXECUTABLE}; run .ci/setup-deps.sh")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 _torch_prefix)
list(GET _torch_info 1 Torch_VERSION)
list(GET _torch_info 2 TORCH_CUDA_BUILD)
list(GET _torch_info 3 TORCH_CXX11_ABI)
list(GET _torch_info 4 TORCH_LIB_DIR)

# Only our own .cu files are compiled; keep torch's CUDA probing to the same architectures.
set(TORCH_CUDA_ARCH_LIST "8.0;9.0+PTX" CACHE STRING "")
list(APPEND CMAKE_PREFIX_PATH ${_torch_prefix})
find_package(Torch REQUIRED CONFIG)
find_library(TORCH_PYTHON_LIBRARY torch_python PATHS ${TORCH_LIB_DIR} NO_DEFAULT_PATH REQUIRED)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(TorchFromPython REQUIRED_VARS TORCH_LIBRARIES TORCH_PYTHON_LIBRARY
                                  VERSION_VAR Torch_VERSION)

# pip's torch loads its own CUDA libraries (NCCL among them) from site-packages/nvidia/*/lib
# through its RPATH. When a CUDA toolkit is also installed, the linker would otherwise resolve
# libtorch_cuda's dependencies against the toolkit's older copies and fail; point it at torch's.
file(GLOB TORCH_NVIDIA_LIB_DIRS LIST_DIRECTORIES true "${TORCH_LIB_DIR}/../../nvidia/*/lib")
set(TORCH_RPATH_LINK_OPTIONS "")
foreach(_dir IN LISTS TORCH_NVIDIA_LIB_DIRS)
  get_filename_component(_dir ${_dir} REALPATH)
  list(APPEND TORCH_RPATH_LINK_OPTIONS "-Wl,-rpath-link,${_dir}")
endforeach()
