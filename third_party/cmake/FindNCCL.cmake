# NCCL headers from the CUDA toolkit (or NCCL_ROOT). The library is linked by soname
# (libnccl.so.2) so the process shares the NCCL that torch already loaded.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES libnccl.so.2 nccl HINTS ENV NCCL_ROOT /usr/local/cuda PATH_SUFFIXES lib64 lib)
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
