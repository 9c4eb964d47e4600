# Finds libtorch (find_package(Torch)) and, for a CUDA libtorch, the CUDA pieces its CMake config
# asks for. Where libtorch comes from, first match wins:
#   1. Torch_DIR (CMake's own variable), or TITAN_LIBTORCH (cache or environment variable): any
#      libtorch folder, e.g. an unpacked libtorch archive or another torch install's prefix;
#   2. TITAN_PYTHON: a Python whose torch package is asked for torch.utils.cmake_prefix_path
#      (scripts/setup.sh passes the project environment of scripts/python_env.sh).
#
# A CUDA libtorch's config (Caffe2/public/cuda.cmake) runs FindCUDA and enable_language(CUDA), so
# it needs nvcc, the CUDA headers and unversioned libraries in one toolkit folder. The NVIDIA
# packages of the Python package index put them elsewhere: nvidia/cu13/{bin,include,lib,nvvm}
# (CUDA 13), or one folder per component (nvidia/cuda_runtime, nvidia/cuda_nvcc, ..., CUDA 12),
# with versioned library names only. When CUDA_TOOLKIT_ROOT_DIR is not given and libtorch sits in
# such a site-packages, titan_cuda_toolkit_view() links those folders into one toolkit layout in
# the build folder (symbolic links, nothing copied) and points CMake at it.
#
# A CUDA libtorch also needs NCCL's header (c10d's ProcessGroupNCCL.hpp includes <nccl.h>):
# NCCL_INCLUDE_DIR when given, else the one of the nvidia-nccl package next to torch
# (site-packages/nvidia/nccl, the NCCL that torch's wheel depends on: c10d's classes are laid out
# by its version macros), else the system's. Without one configuring fails, naming where it
# looked: a build without NCCL process groups could not train on GPUs.
#
# Sets TITAN_TORCH_VERSION, TITAN_TORCH_CUDA (ON for a CUDA libtorch) and, with CUDA,
# TITAN_NCCL_INCLUDE_DIR for the caller.

set(TITAN_LIBTORCH "$ENV{TITAN_LIBTORCH}" CACHE PATH
    "A libtorch folder to build against (else TITAN_PYTHON's torch)")
set(TITAN_PYTHON "" CACHE FILEPATH
    "A Python with torch installed; its torch.utils.cmake_prefix_path is searched for libtorch")
set(TITAN_CUDA_ARCH_LIST "9.0" CACHE STRING
    "CUDA architectures for our own kernels (TORCH_CUDA_ARCH_LIST syntax; 9.0 = H100/H200)")

if(NOT Torch_DIR)
  if(TITAN_LIBTORCH)
    if(NOT EXISTS "${TITAN_LIBTORCH}")
      message(FATAL_ERROR "TITAN_LIBTORCH=${TITAN_LIBTORCH} does not exist")
    endif()
    list(PREPEND CMAKE_PREFIX_PATH "${TITAN_LIBTORCH}")
  elseif(TITAN_PYTHON)
    execute_process(
      COMMAND "${TITAN_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _titan_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_VARIABLE _titan_torch_error RESULT_VARIABLE _titan_torch_result)
    if(NOT _titan_torch_result EQUAL 0)
      message(FATAL_ERROR "TITAN_PYTHON=${TITAN_PYTHON} cannot import torch:\n"
                          "${_titan_torch_error}\nHINT: run scripts/setup.sh, which installs "
                          "the pinned torch (scripts/python_env.sh)")
    endif()
    list(PREPEND CMAKE_PREFIX_PATH "${_titan_torch_prefix}")
  else()
    message(STATUS "titan: neither TITAN_LIBTORCH nor TITAN_PYTHON set; searching "
                   "CMAKE_PREFIX_PATH for libtorch")
  endif()
endif()

# The libtorch folder that find_package(Torch) will pick, without running it: the first prefix
# holding Torch/TorchConfig.cmake (prefixes are either <libtorch> or <torch>/share/cmake).
function(titan_locate_libtorch out)
  set(candidates)
  if(Torch_DIR)
    list(APPEND candidates "${Torch_DIR}/../../..")
  endif()
  foreach(prefix ${CMAKE_PREFIX_PATH})
    list(APPEND candidates "${prefix}" "${prefix}/../..")
  endforeach()
  foreach(dir ${candidates})
    get_filename_component(dir "${dir}" ABSOLUTE)
    if(EXISTS "${dir}/share/cmake/Torch/TorchConfig.cmake" AND EXISTS "${dir}/lib")
      set(${out} "${dir}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# titan_cuda_toolkit_view(SITE_PACKAGES OUT_DIR): links the nvidia/* packages next to torch into
# OUT_DIR/{bin,include,lib,lib64,nvvm}, adding unversioned names (libcudart.so -> .so.13).
function(titan_cuda_toolkit_view site view)
  file(GLOB components LIST_DIRECTORIES true "${site}/nvidia/*")
  file(REMOVE_RECURSE "${view}")
  file(MAKE_DIRECTORY "${view}/bin" "${view}/include" "${view}/lib")
  foreach(component ${components})
    foreach(sub bin include lib nvvm)
      if(NOT IS_DIRECTORY "${component}/${sub}")
        continue()
      endif()
      if(sub STREQUAL "nvvm")
        if(NOT EXISTS "${view}/nvvm")
          file(CREATE_LINK "${component}/nvvm" "${view}/nvvm" SYMBOLIC)
        endif()
        continue()
      endif()
      file(GLOB entries LIST_DIRECTORIES true RELATIVE "${component}/${sub}" "${component}/${sub}/*")
      foreach(entry ${entries})
        if(NOT EXISTS "${view}/${sub}/${entry}")  # the first package to provide a name wins
          file(CREATE_LINK "${component}/${sub}/${entry}" "${view}/${sub}/${entry}" SYMBOLIC)
        endif()
        # libfoo.so.13 -> also libfoo.so, which is what find_library and -lfoo look for.
        if(sub STREQUAL "lib" AND entry MATCHES "^(lib[^.]+)\\.so\\.[0-9.]+$")
          set(plain "${CMAKE_MATCH_1}.so")
          if(NOT EXISTS "${view}/lib/${plain}")
            file(CREATE_LINK "${component}/lib/${entry}" "${view}/lib/${plain}" SYMBOLIC)
          endif()
        endif()
      endforeach()
    endforeach()
  endforeach()
  file(CREATE_LINK "lib" "${view}/lib64" SYMBOLIC)
endfunction()

titan_locate_libtorch(_titan_libtorch)
set(TITAN_TORCH_CUDA OFF)
if(_titan_libtorch AND EXISTS "${_titan_libtorch}/lib/libtorch_cuda.so")
  set(TITAN_TORCH_CUDA ON)
  get_filename_component(_titan_site "${_titan_libtorch}/.." ABSOLUTE)
  if(NOT CUDA_TOOLKIT_ROOT_DIR AND IS_DIRECTORY "${_titan_site}/nvidia")
    set(_titan_view "${CMAKE_BINARY_DIR}/cuda-toolkit")
    titan_cuda_toolkit_view("${_titan_site}" "${_titan_view}")
    if(NOT EXISTS "${_titan_view}/bin/nvcc")
      message(FATAL_ERROR
        "libtorch at ${_titan_libtorch} is a CUDA build, and its CMake config needs nvcc, which "
        "is not among the NVIDIA packages in ${_titan_site}/nvidia. HINT: install the pinned "
        "environment (scripts/python_env.sh; it adds nvidia-cuda-nvcc of torch's CUDA release), "
        "or pass -DCUDA_TOOLKIT_ROOT_DIR=<a CUDA toolkit of that release>")
    endif()
    set(CUDA_TOOLKIT_ROOT_DIR "${_titan_view}" CACHE PATH "CUDA toolkit (a view of the wheels)")
  endif()
  if(CUDA_TOOLKIT_ROOT_DIR AND NOT CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc" CACHE FILEPATH "nvcc")
  endif()
  # CMake 3.25 cannot detect a default architecture with CUDA 13 and no GPU; libtorch's config
  # then takes TORCH_CUDA_ARCH_LIST for its NVCC flags.
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    string(REPLACE "." "" _titan_arch "${TITAN_CUDA_ARCH_LIST}")
    set(CMAKE_CUDA_ARCHITECTURES "${_titan_arch}" CACHE STRING "CUDA architectures")
  endif()
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(ENV{TORCH_CUDA_ARCH_LIST} "${TITAN_CUDA_ARCH_LIST}")
  endif()
endif()

find_package(Torch REQUIRED)
set(TITAN_TORCH_VERSION "${Torch_VERSION}")
if(TITAN_TORCH_VERSION VERSION_LESS 2.11)
  message(FATAL_ERROR "libtorch ${TITAN_TORCH_VERSION} found (${TORCH_INSTALL_PREFIX}); "
                      "titan.cpp supports libtorch 2.11 to 2.15. HINT: run scripts/setup.sh "
                      "(pinned torch 2.15.0) or point TITAN_LIBTORCH at a supported libtorch")
endif()
message(STATUS "titan: libtorch ${TITAN_TORCH_VERSION} (CUDA: ${TITAN_TORCH_CUDA}) at "
               "${TORCH_INSTALL_PREFIX}")

if(TITAN_TORCH_CUDA)
  set(_titan_nccl_hints)
  foreach(dir "${NCCL_INCLUDE_DIR}" "$ENV{NCCL_INCLUDE_DIR}" "$ENV{NCCL_ROOT}/include")
    if(dir AND NOT dir STREQUAL "/include")
      list(APPEND _titan_nccl_hints "${dir}")
    endif()
  endforeach()
  set(_titan_nccl_system /usr/include /usr/local/include /usr/local/cuda/include)
  if(CUDA_TOOLKIT_ROOT_DIR)
    list(APPEND _titan_nccl_system "${CUDA_TOOLKIT_ROOT_DIR}/include")
  endif()
  get_filename_component(_titan_torch_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  set(_titan_nccl_wheel "${_titan_torch_site}/nvidia/nccl/include")
  find_path(TITAN_NCCL_INCLUDE_DIR nccl.h
            HINTS ${_titan_nccl_hints}
            PATHS "${_titan_nccl_wheel}" ${_titan_nccl_system}
            NO_DEFAULT_PATH)
  if(NOT TITAN_NCCL_INCLUDE_DIR)
    set(_titan_nccl_looked ${_titan_nccl_hints} "${_titan_nccl_wheel}" ${_titan_nccl_system})
    string(REPLACE ";" ", " _titan_nccl_looked "${_titan_nccl_looked}")
    message(FATAL_ERROR
      "libtorch at ${TORCH_INSTALL_PREFIX} is a CUDA build, but NCCL's header nccl.h was not "
      "found (looked in: ${_titan_nccl_looked}); without it titan would have no NCCL process "
      "groups and could not train on GPUs. HINT: install the nvidia-nccl package of torch's CUDA "
      "release into that Python (torch's own wheels depend on it), or the system's NCCL "
      "development package (libnccl-dev), or pass -DNCCL_INCLUDE_DIR=<a folder holding nccl.h>")
  endif()
  message(STATUS "titan: NCCL header from ${TITAN_NCCL_INCLUDE_DIR}")
endif()
