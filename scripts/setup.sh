#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for titan.cpp and builds it: installs the Debian packages we
# need (only what is missing), the pinned Python environment whose torch 2.15.0 wheel carries the
# libtorch we build against (scripts/python_env.sh, cached in ~/.cache/titan/python), fetches the
# built-in `sotu` corpus into the cache, builds build/titan in Release against that libtorch, and
# trains the default tokenizer (assets/tokenizer/sotu_2k, scripts/build_tokenizer.sh).
# Idempotent; quick when nothing changed.
#
#   scripts/setup.sh                               # everything
#   TITAN_BUILD_DIR=build-x scripts/setup.sh       # another build folder
#   TITAN_LIBTORCH=/opt/libtorch scripts/setup.sh  # build against another libtorch (2.11 to 2.15)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${TITAN_BUILD_DIR:-$root/build}"

# libtorch itself comes from the torch wheel (python_env.sh); gloo's headers come from Debian
# (libtorch ships c10d's ProcessGroupGloo.hpp, which includes them, but not gloo's own headers;
# nothing links Debian's libgloo: Gloo's code is inside libtorch). clang and its runtime
# libraries (libFuzzer, sanitizers) build the parser fuzzers (scripts/fuzz.sh); clang-format (the
# same major version, 14) checks and applies the code layout (.clang-format, scripts/format.sh).
# iproute2's ip builds the two-host test bed of network namespaces (tests/e2e/test_multihost.sh);
# nftables' nft drops a share of its packets there, and where the kernel lacks netem, iptables
# sends them through an NFQUEUE that the build's netdelay (libnetfilter-queue) holds a while.
# zlib and zstd read compressed JSON-lines datasets (.jsonl.gz, .jsonl.zst); the zstd command
# writes the tests' fixtures. libpng and libjpeg-turbo decode the image datasets' PNG and JPEG.
packages=(
  build-essential cmake ninja-build pkg-config
  libgloo-dev
  libtomlplusplus-dev nlohmann-json3-dev libgtest-dev
  ca-certificates
  clang libclang-rt-14-dev clang-format
  iproute2 nftables iptables libnetfilter-queue-dev
  zlib1g-dev libzstd-dev zstd
  libpng-dev libjpeg62-turbo-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js/npm (corpus fetch) and a Python 3 with venv (python_env.sh) may come from outside
# Debian's packages (e.g. pyenv); Debian's are installed only when none is there.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3 python3-venv)
if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

python="$(bash "$root/scripts/python_env.sh")"

bash "$root/scripts/fetch_sotu.sh"

# Configure when the folder is new or was configured for another libtorch (e.g. an old build
# folder made against Debian's libtorch 1.13): the stamp records what the configuration used.
configured="python=${python} libtorch=${TITAN_LIBTORCH:-}"
stamp="$build_dir/.titan-configured"
if [ ! -f "$build_dir/build.ninja" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$configured" ]; then
  rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DTITAN_PYTHON="$python" -DTITAN_LIBTORCH="${TITAN_LIBTORCH:-}"
  echo "$configured" >"$stamp"
fi
cmake --build "$build_dir" -j "$(nproc)"
bash "$root/scripts/build_tokenizer.sh" "$build_dir/titan"
echo "[setup] ready: $build_dir/titan"
