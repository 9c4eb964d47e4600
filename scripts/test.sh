#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test: gtest unit suites and end-to-end
# runs of the real binary, all through ctest. The cases labelled `cuda` (filters of the unit
# binaries, for scripts/gpu_check.sh) are left out: their tests already run in the unit binaries,
# and e2e_test_gpu_check_tools runs them once more through the GPU check's CPU dry run. Cases run
# side by side, as many cores as there are (TITAN_TEST_JOBS overrides); the ones that use two
# cores claim two (CMakeLists.txt, PROCESSORS).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "${TITAN_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "${TITAN_TEST_JOBS:-$(nproc)}" -LE '^cuda$' "$@"
