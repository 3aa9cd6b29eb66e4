# NCCL's header and library. torch's own NCCL (pip's nvidia-nccl package, beside torch) comes
# first: ProcessGroupNCCL's class layout depends on the nccl.h it was compiled with, so ours must
# be the same one. Then NCCL_ROOT, then the CUDA toolkit. The library is linked by soname
# (libnccl.so.2) so the process shares the NCCL that torch already loaded.
set(_nccl_hints $ENV{NCCL_ROOT})
if(TORCH_LIB_DIR)
  list(PREPEND _nccl_hints ${TORCH_LIB_DIR}/../../nvidia/nccl)
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES libnccl.so.2 nccl HINTS ${_nccl_hints} /usr/local/cuda PATH_SUFFIXES lib64 lib
            )
if(NCCL_INCLUDE_DIR)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_defs REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
         NCCL_HEADER_VERSION "${_nccl_defs}")
endif()
if(NCCL_INCLUDE_DIR AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl INTERFACE IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR}
                                              INTERFACE_LINK_LIBRARIES "-l:libnccl.so.2")
  if(NCCL_LIBRARY)
    get_filename_component(_nccl_dir ${NCCL_LIBRARY} DIRECTORY)
    set_property(TARGET NCCL::nccl APPEND PROPERTY INTERFACE_LINK_DIRECTORIES ${_nccl_dir})
  endif()
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_INCLUDE_DIR VERSION_VAR NCCL_HEADER_VERSION)
