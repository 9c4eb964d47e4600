#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test: gtest unit suites and end-to-end
# runs of the real binary, all through ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "${TITAN_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j 1 "$@"
