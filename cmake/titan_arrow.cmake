# Finds Apache Arrow's and Parquet's C++ libraries in the pyarrow wheel of the project's Python
# environment (scripts/python_env.sh), the way titan_torch.cmake finds libtorch in torch's wheel:
# the wheel ships the headers (pyarrow/include) and the shared libraries (pyarrow/libarrow.so.N,
# pyarrow/libparquet.so.N, versioned names only). The data library reads parquet datasets with
# them (src/titan/components/data/parquet_file.cpp).
#
# Where pyarrow comes from, first match wins: TITAN_PYARROW_DIR (cache or environment variable:
# the pyarrow package folder), else TITAN_PYTHON's `import pyarrow`. Without either, configuring
# fails with a HINT to run scripts/setup.sh (which installs the pinned environment).
#
# Defines the INTERFACE target titan_arrow (include directories and libraries) and adds the
# libraries' folder to the build and install RPATH, so build/titan runs without LD_LIBRARY_PATH.

set(TITAN_PYARROW_DIR "$ENV{TITAN_PYARROW_DIR}" CACHE PATH
    "The pyarrow package folder with include/ and libarrow.so.N (else TITAN_PYTHON's pyarrow)")

if(NOT TITAN_PYARROW_DIR)
  if(NOT TITAN_PYTHON)
    message(FATAL_ERROR "titan needs Apache Arrow's C++ libraries (parquet datasets), taken from "
                        "the pyarrow package of the project's Python environment, but neither "
                        "TITAN_PYARROW_DIR nor TITAN_PYTHON is set.\nHINT: run scripts/setup.sh, "
                        "or configure with -DTITAN_PYTHON=$(scripts/python_env.sh --print)")
  endif()
  execute_process(
    COMMAND "${TITAN_PYTHON}" -c "import os, pyarrow; print(os.path.dirname(pyarrow.__file__))"
    OUTPUT_VARIABLE _titan_pyarrow_dir OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_VARIABLE _titan_pyarrow_error RESULT_VARIABLE _titan_pyarrow_result)
  if(NOT _titan_pyarrow_result EQUAL 0)
    message(FATAL_ERROR "TITAN_PYTHON=${TITAN_PYTHON} cannot import pyarrow (Apache Arrow's C++ "
                        "libraries for parquet datasets come from its wheel):\n"
                        "${_titan_pyarrow_error}\nHINT: run scripts/setup.sh, which installs the "
                        "pinned environment (scripts/python_env.sh)")
  endif()
  set(TITAN_PYARROW_DIR "${_titan_pyarrow_dir}" CACHE PATH
      "The pyarrow package folder with include/ and libarrow.so.N" FORCE)
endif()

# The library `name` of the wheel: lib<name>.so.N (the SONAME the wheel links by).
function(titan_pyarrow_library out name)
  file(GLOB candidates "${TITAN_PYARROW_DIR}/lib${name}.so" "${TITAN_PYARROW_DIR}/lib${name}.so.*")
  set(best "")
  foreach(candidate ${candidates})
    string(LENGTH "${candidate}" length)
    if(NOT best OR length LESS best_length)
      set(best "${candidate}")
      set(best_length ${length})
    endif()
  endforeach()
  if(NOT best)
    message(FATAL_ERROR "no lib${name}.so in ${TITAN_PYARROW_DIR} (pyarrow's folder). HINT: run "
                        "scripts/setup.sh to reinstall the pinned pyarrow")
  endif()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

if(NOT EXISTS "${TITAN_PYARROW_DIR}/include/parquet/arrow/reader.h")
  message(FATAL_ERROR "${TITAN_PYARROW_DIR}/include has no parquet/arrow/reader.h; pyarrow's wheel "
                      "ships Arrow's C++ headers there. HINT: run scripts/setup.sh")
endif()
titan_pyarrow_library(TITAN_ARROW_LIBRARY arrow)
titan_pyarrow_library(TITAN_PARQUET_LIBRARY parquet)

# pyarrow's wheels are built with the C++11 string ABI; a libtorch built with the old one
# (-D_GLIBCXX_USE_CXX11_ABI=0) could not pass std::string to Arrow.
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  message(FATAL_ERROR "libtorch uses the old C++ string ABI (${TORCH_CXX_FLAGS}) but pyarrow's "
                      "Arrow libraries the new one. HINT: use a libtorch built with "
                      "_GLIBCXX_USE_CXX11_ABI=1 (every torch wheel since 2.7 is)")
endif()

add_library(titan_arrow INTERFACE)
target_include_directories(titan_arrow SYSTEM INTERFACE "${TITAN_PYARROW_DIR}/include")
target_link_libraries(titan_arrow INTERFACE "${TITAN_PARQUET_LIBRARY}" "${TITAN_ARROW_LIBRARY}")
list(APPEND CMAKE_BUILD_RPATH "${TITAN_PYARROW_DIR}")
list(APPEND CMAKE_INSTALL_RPATH "${TITAN_PYARROW_DIR}")
message(STATUS "titan: Arrow/Parquet from ${TITAN_PYARROW_DIR}")
