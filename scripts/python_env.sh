#!/usr/bin/env bash
# The project's Python environment: a virtual environment holding exactly the packages pinned in
# scripts/python-requirements.txt (torch 2.15.0 whose libtorch we build against, the CUDA compiler
# pieces its CMake config needs, and the Python references of the tests and benchmarks), in
#   ${TITAN_CACHE:-$HOME/.cache/titan}/python/<python version>-<sha256 of the requirements>/
# so that every checkout and build folder on a machine shares one copy, and a changed pin gets a
# fresh environment. The folder is complete only once it carries the stamp file; an interrupted
# install is removed and redone on the next run. Prints the environment's python on stdout.
#
#   py="$(scripts/python_env.sh)"        # install if needed (about 2 minutes, 6 GB), then the path
#   scripts/python_env.sh --print        # the path only; exit 1 if not installed
#
# TITAN_PYTHON_BASE picks the interpreter that creates the environment (default: python3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/cache_lib.sh"

requirements="$root/scripts/python-requirements.txt"
base="${TITAN_PYTHON_BASE:-python3}"
command -v "$base" >/dev/null 2>&1 || cache_die "no ${base} on PATH (Python 3.10 or newer is needed)"
version="$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$version" in
  3.1[0-9]) ;;
  *) cache_die "${base} is Python ${version}; the pinned packages need Python 3.10 to 3.19" ;;
esac
key="py${version}-$(sha256_of "$requirements" | cut -c1-16)"
env_dir="$(titan_cache_root)/python/${key}"
stamp="${env_dir}/.installed"

if [[ "${1:-}" == "--print" ]]; then
  [[ -f "$stamp" ]] || exit 1
  echo "${env_dir}/bin/python"
  exit 0
fi

if [[ ! -f "$stamp" ]]; then
  rm -rf "$env_dir"
  mkdir -p "$(dirname "$env_dir")"
  echo "[python_env] creating ${env_dir} (pinned: $(grep -c '==' "$requirements") packages)" >&2
  start=$(date +%s)
  "$base" -m venv "$env_dir"
  # --no-input: never wait for a prompt in CI; the index is the machine's configured one.
  "${env_dir}/bin/python" -m pip install --no-input -q -r "$requirements" >&2 ||
    cache_die "pip could not install ${requirements} into ${env_dir}"
  "${env_dir}/bin/python" -c 'import torch, transformers, tokenizers, tiktoken' >&2 ||
    cache_die "the environment ${env_dir} does not import its packages"
  echo "$key" >"$stamp"
  echo "[python_env] installed in $(($(date +%s) - start)) s" >&2
fi
echo "${env_dir}/bin/python"
