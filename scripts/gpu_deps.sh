#!/usr/bin/env bash
# Prepares, on a dev machine (scripts/setup.sh ran there), the folder that scripts/gpu_check.sh
# needs on a GPU machine that has a Python with torch, nvcc, CMake and ninja but no package
# registry and none of our C++ dependencies:
#
#   .gpu-deps/include/{toml++,nlohmann,gloo}    headers (toml++ used header-only there)
#   .gpu-deps/include/{zlib,zconf,zstd,zstd_errors}.h, .gpu-deps/lib/lib{z,zstd}.so*
#                                               compressed datasets (CMAKE_PREFIX_PATH there)
#   .gpu-deps/cmake/{tomlplusplus,nlohmann_json}/*Config.cmake
#                                               config files for our find_package calls
#   .gpu-deps/src/googletest                    GoogleTest's sources (gpu_check.sh builds them
#                                               with the compiler and C++ ABI of that machine)
#   .gpu-deps/cache/datasets/sotu               the built-in corpus (TITAN_CACHE there)
#   .gpu-deps/cache/tokenizers/sotu_2k          its 2,048-id tokenizer, when built here
#   .gpu-deps/MANIFEST                          what was copied from where, and the versions
#
# The folder is git-ignored; it travels next to the checkout (about 18 MB), e.g. as a `carry`
# path, or with rsync/scp. Idempotent: the folder is rebuilt from scratch each run.
#
#   scripts/gpu_deps.sh            # into <repo>/.gpu-deps
#   scripts/gpu_deps.sh DIR        # into DIR
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/cache_lib.sh"
dest="${1:-$root/.gpu-deps}"

die() {
  echo "gpu_deps: error: $*" >&2
  exit 1
}

hint="HINT: run scripts/setup.sh on this machine (it installs libtomlplusplus-dev, "
hint+="nlohmann-json3-dev, libgloo-dev, libgtest-dev, zlib1g-dev, libzstd-dev and fetches the corpus)"
for dir in /usr/include/toml++ /usr/include/nlohmann /usr/include/gloo /usr/src/googletest; do
  [[ -d "$dir" ]] || die "$dir is missing. $hint"
done
corpus="$(titan_cache_root)/datasets/sotu"
[[ -f "$corpus/.fetched" ]] || die "no sotu corpus in $corpus. $hint"

json_version() {
  local part="$1"
  sed -nE "s/^#define NLOHMANN_JSON_VERSION_${part} ([0-9]+).*/\1/p" \
    /usr/include/nlohmann/detail/abi_macros.hpp /usr/include/nlohmann/json.hpp 2>/dev/null |
    head -n 1
}
toml_version() {
  local part="$1"
  sed -nE "s/^#define TOML_LIB_${part} ([0-9]+).*/\1/p" \
    /usr/include/toml++/impl/version.h 2>/dev/null | head -n 1
}
json_ver="$(json_version MAJOR).$(json_version MINOR).$(json_version PATCH)"
toml_ver="$(toml_version MAJOR).$(toml_version MINOR).$(toml_version PATCH)"
[[ "$json_ver" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "cannot read nlohmann/json's version"
[[ "$toml_ver" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "cannot read toml++'s version"

work="$(mktemp -d "${dest}.tmp.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/include" "$work/cmake/tomlplusplus" "$work/cmake/nlohmann_json" "$work/src" \
  "$work/cache/datasets" "$work/cache/tokenizers"

cp -a /usr/include/toml++ /usr/include/nlohmann /usr/include/gloo "$work/include/"
# zlib and zstd (compressed datasets): headers and shared libraries, found through
# CMAKE_PREFIX_PATH there (the GPU machine may lack their -dev packages).
mkdir -p "$work/lib"
arch_lib="/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
for header in zlib.h zconf.h zstd.h zstd_errors.h; do
  src="/usr/include/$header"
  [[ -f "$src" ]] || src="/usr/include/$(gcc -print-multiarch 2>/dev/null)/$header"
  [[ -f "$src" ]] || die "$header is missing. $hint"
  cp "$src" "$work/include/"
done
for lib in libz libzstd; do
  [[ -e "$arch_lib/$lib.so" ]] || die "$arch_lib/$lib.so is missing. $hint"
  cp -a "$arch_lib/$lib".so* "$work/lib/"
done
# GoogleTest without its own tests and docs (not built, not needed).
cp -a /usr/src/googletest "$work/src/googletest"
rm -rf "$work/src/googletest/googletest/test" "$work/src/googletest/googlemock/test" \
  "$work/src/googletest/googletest/docs" "$work/src/googletest/docs"
cp -a "$corpus" "$work/cache/datasets/sotu"
tokenizer="$(titan_cache_root)/tokenizers/sotu_2k"
if [[ -f "$tokenizer/tokenizer.json" ]]; then
  cp -a "$tokenizer" "$work/cache/tokenizers/sotu_2k"
fi

# Config files of our own: imported targets over the copied headers, found through
# -D<name>_DIR=.gpu-deps/cmake/<name>. toml++ is used header-only (Debian's config links its
# shared library instead, which the GPU machine does not have).
write_version_file() {
  local file="$1" version="$2"
  cat >"$file" <<EOF
# Written by scripts/gpu_deps.sh: version ${version}; any request of the same major version
# at or below it is compatible.
set(PACKAGE_VERSION "${version}")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION OR
   (PACKAGE_FIND_VERSION AND NOT PACKAGE_FIND_VERSION_MAJOR EQUAL "${version%%.*}"))
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
EOF
}
write_config_file() {  # write_config_file FILE TARGET [COMPILE_DEFINITION]
  local file="$1" target="$2" define="${3:-}"
  cat >"$file" <<EOF
# Written by scripts/gpu_deps.sh: ${target} over the headers in ../../include.
get_filename_component(_gpu_deps_include "\${CMAKE_CURRENT_LIST_DIR}/../../include" ABSOLUTE)
if(NOT TARGET ${target})
  add_library(${target} INTERFACE IMPORTED)
  set_target_properties(${target} PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "\${_gpu_deps_include}")
EOF
  if [[ -n "$define" ]]; then
    printf '  set_target_properties(%s PROPERTIES INTERFACE_COMPILE_DEFINITIONS "%s")\n' \
      "$target" "$define" >>"$file"
  fi
  printf 'endif()\nunset(_gpu_deps_include)\n' >>"$file"
}
write_config_file "$work/cmake/tomlplusplus/tomlplusplusConfig.cmake" \
  tomlplusplus::tomlplusplus "TOML_HEADER_ONLY=1"
write_version_file "$work/cmake/tomlplusplus/tomlplusplusConfigVersion.cmake" "$toml_ver"
write_config_file "$work/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" \
  nlohmann_json::nlohmann_json
write_version_file "$work/cmake/nlohmann_json/nlohmann_jsonConfigVersion.cmake" "$json_ver"

gtest_ver="$(sed -nE 's/.*set\(GOOGLETEST_VERSION ([0-9.]+)\).*/\1/p' \
  /usr/src/googletest/CMakeLists.txt | head -n 1)"
{
  echo "# scripts/gpu_deps.sh on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "toml++          ${toml_ver}   /usr/include/toml++ (header-only)"
  echo "nlohmann_json   ${json_ver}   /usr/include/nlohmann"
  echo "gloo headers    $(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null || echo '?')" \
    "  /usr/include/gloo"
  echo "googletest      ${gtest_ver}   /usr/src/googletest (sources)"
  echo "zlib, zstd      $(dpkg-query -W -f='${Version}' zlib1g-dev 2>/dev/null || echo '?')," \
    "$(dpkg-query -W -f='${Version}' libzstd-dev 2>/dev/null || echo '?')   $arch_lib"
  echo "sotu corpus     $(head -c 80 "$corpus/.fetched")"
  if [[ -f "$work/cache/tokenizers/sotu_2k/tokenizer.json" ]]; then
    echo "sotu_2k         $tokenizer"
  else
    echo "sotu_2k         (not built here: gpu_check.sh trains it)"
  fi
} >"$work/MANIFEST"

rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "gpu_deps: ready: $dest ($(du -sh "$dest" | cut -f1))"
echo "gpu_deps: take it along with the checkout to the GPU machine, then run scripts/gpu_check.sh"
