#!/usr/bin/env bash
# Builds titan and its tests under a sanitizer, in a build folder of their own, and runs the unit
# and end-to-end suites through ctest with that build's binary. The whole project is instrumented
# (the parser fuzzers of scripts/fuzz.sh cover only the parsers); libtorch is the prebuilt one.
#
#   scripts/sanitize.sh address                  # AddressSanitizer: unit_* and e2e_* cases
#   scripts/sanitize.sh undefined -R '^unit_'    # UBSan, the unit suites only (ctest arguments)
#   scripts/sanitize.sh thread                   # ThreadSanitizer (scripts/tsan-suppressions.txt)
#   TITAN_SANITIZE_BUILD_DIR=/tmp/b scripts/sanitize.sh address   # default build-<sanitizer>
#
# Every report goes to <build folder>/sanitizer-logs/, from every process of every case (ranks,
# launchers, the Python references are not instrumented). Exits 1 when a case fails or any report
# was written, and prints the reports' first lines. On 2 cores: AddressSanitizer builds in about
# 14 min and runs the suites in about 42 min; UBSan in about 18 and 21 min; ThreadSanitizer
# builds in about 9 min and runs the unit suites in 7 (docs/testing.md).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sanitizer="${1:-}"
unit_threads=2  # the unit suites' OMP_NUM_THREADS under ctest (CMake's TITAN_UNIT_OMP_NUM_THREADS)
case "$sanitizer" in
  address) flags="-fsanitize=address" ;;
  # vptr needs the type information of every polymorphic class, libtorch's too: left out.
  undefined) flags="-fsanitize=undefined -fno-sanitize=vptr" ;;
  # OpenMP on one thread: see TSAN_OPTIONS below.
  thread) flags="-fsanitize=thread" unit_threads=1 ;;
  *)
    echo "usage: scripts/sanitize.sh address|undefined|thread [ctest arguments]" >&2
    exit 2
    ;;
esac
shift
ctest_args=("$@")
((${#ctest_args[@]} > 0)) || ctest_args=(-R '^(unit|e2e)_' -E '^e2e_test_gpu_check_tools$')

build_dir="${TITAN_SANITIZE_BUILD_DIR:-$root/build-$sanitizer}"
logs="$build_dir/sanitizer-logs"
python="${TITAN_PYTHON:-$(bash "$root/scripts/python_env.sh" --print)}"

# Configure when the folder is new or was configured otherwise (as setup.sh does).
configured="python=${python} libtorch=${TITAN_LIBTORCH:-} flags=${flags} unit_threads=${unit_threads}"
stamp="$build_dir/.titan-configured"
if [ ! -f "$build_dir/build.ninja" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$configured" ]; then
  rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer -g1" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DTITAN_UNIT_OMP_NUM_THREADS="$unit_threads" \
    -DTITAN_PYTHON="$python" -DTITAN_LIBTORCH="${TITAN_LIBTORCH:-}" >/dev/null
  echo "$configured" >"$stamp"
fi
build_start=$SECONDS
cmake --build "$build_dir" -j "$(nproc)" >"$build_dir/sanitize-build.log" 2>&1 ||
  { tail -50 "$build_dir/sanitize-build.log"; exit 1; }
echo "[sanitize] $sanitizer build: $((SECONDS - build_start)) s ($build_dir)"

rm -rf "$logs"
mkdir -p "$logs"
# Leaks: libtorch keeps its registries to the end; detecting them would report libtorch's.
# alloc_dealloc_mismatch and container overflow: libtorch's uninstrumented code frees and grows
# what instrumented code allocated; the checks would report the mix, not a bug.
export ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:detect_container_overflow=0:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$logs/ubsan"
# ThreadSanitizer: exit codes stay the program's (the cases check them; the reports fail the run),
# and OpenMP regions run on one thread: libgomp is not instrumented, so its workers' accesses would
# be reported against the thread that forked them (titan's own threads are what is checked here).
export TSAN_OPTIONS="log_path=$logs/tsan:exitcode=0:second_deadlock_stack=1:history_size=4:suppressions=$root/scripts/tsan-suppressions.txt"
# Unit cases that measure what the sanitizer changes, not what the code does. Adam's L2 update
# rounded as ATen's: AddressSanitizer's and ThreadSanitizer's builds compile titan's kernels for
# the baseline instruction set, without FMA, while ATen's round g + wd * p once.
adam="Optimizer/OptimizerImplementation.Float32MatchesForLoop/Adam"
if [ "$sanitizer" = address ]; then
  # And resident memory: AddressSanitizer's quarantine keeps freed blocks.
  export GTEST_FILTER="-PrepareDir.StreamingALargeCorpusKeepsMemoryBounded:$adam"
fi
if [ "$sanitizer" = thread ]; then
  # One thread asked for as well as one run (the unit suites' through unit_threads): unit
  # cases do not go through configure_threads, which caps the threads at the limit, and bf16
  # matmuls give NaN when fewer threads run than were asked for.
  export OMP_THREAD_LIMIT=1 OMP_NUM_THREADS=1
  # And the one case that checks that titan's kernels run on several OpenMP threads.
  export GTEST_FILTER="-ParallelFor.TitanCodeSplitsWorkOverTheIntraOpThreads:$adam"
fi
export TITAN_PYTHON="$python"
test_start=$SECONDS
status=0
(cd "$build_dir" && ctest --output-on-failure -j "$(nproc)" --timeout 1800 "${ctest_args[@]}") ||
  status=1
echo "[sanitize] $sanitizer tests: $((SECONDS - test_start)) s"
while IFS= read -r f; do
  echo "[sanitize] report $f:"
  head -n 20 "$f"
  status=1
done < <(find "$logs" -type f | sort)
[ "$status" = 0 ] && echo "[sanitize] $sanitizer: every case passed, no report"
exit "$status"
