#!/usr/bin/env bash
# Runs the libFuzzer harnesses of the parsers of untrusted input (tests/fuzz/fuzz_*.cpp) for
# SECONDS each (default 60) under AddressSanitizer + UBSan, each from a scratch copy of its seed
# corpus (tests/fuzz/corpus/<parser>/, never written to) with its dictionary
# (tests/fuzz/dict/<parser>.dict) when there is one. Configures and builds the fuzz build first
# (clang, its own build folder) when needed. Prints the executions run per harness; exits 1 on any
# finding (crash, sanitizer report, unexpected exception, leak, timeout, out of memory) and names
# the input that caused it. The harnesses run side by side, TITAN_FUZZ_JOBS at a time (default: one
# per core).
#
#   scripts/fuzz.sh                        # 60 s per harness
#   scripts/fuzz.sh 20 config jsonl        # 20 s, only fuzz_config and fuzz_jsonl
#   TITAN_FUZZ_BUILD_DIR=/tmp/fz scripts/fuzz.sh   # another build folder (default build/fuzz)
#   TITAN_FUZZ_WORK_DIR=/tmp/w scripts/fuzz.sh     # keep corpora, logs and findings there
#
# A finding is replayed with the harness and the input: build/fuzz/fuzz_<parser> <file>.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
shift || true
build_dir="${TITAN_FUZZ_BUILD_DIR:-$root/build/fuzz}"
work="${TITAN_FUZZ_WORK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/titan-fuzz.XXXXXX")}"

mkdir -p "$work"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "[fuzz] SECONDS must be a positive integer, got '$seconds'" >&2
  exit 2
fi
if ! command -v clang++ >/dev/null 2>&1; then
  echo "[fuzz] clang++ not found. HINT: scripts/setup.sh installs it (Debian: clang," \
       "libclang-rt-14-dev for libFuzzer)" >&2
  exit 2
fi

# Configure when the folder is new or was configured for another libtorch (as setup.sh does).
python="${TITAN_PYTHON:-$(bash "$root/scripts/python_env.sh" --print)}"
configured="python=${python} libtorch=${TITAN_LIBTORCH:-}"
stamp="$build_dir/.titan-configured"
if [ ! -f "$build_dir/build.ninja" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$configured" ]; then
  rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
  cmake -S "$root/tests/fuzz" -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
    -DTITAN_PYTHON="$python" -DTITAN_LIBTORCH="${TITAN_LIBTORCH:-}" >"$work/configure.log" 2>&1 ||
    { cat "$work/configure.log"; exit 1; }
  echo "$configured" >"$stamp"
fi
build_start=$SECONDS
cmake --build "$build_dir" -j "$(nproc)" >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log"; exit 1; }
echo "[fuzz] build: $((SECONDS - build_start)) s ($build_dir); work folder: $work"

harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  for exe in "$build_dir"/fuzz_*; do
    [ -x "$exe" ] && harnesses+=("$(basename "$exe" | sed 's/^fuzz_//')")
  done
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
for name in "${harnesses[@]}"; do
  [ -x "$build_dir/fuzz_$name" ] || { echo "[fuzz] no harness $build_dir/fuzz_$name" >&2; exit 2; }
done
mkdir -p "$work/findings"

# One harness: fuzzes for SECONDS and leaves its exit status in $work/<name>.rc.
run_harness() {
  local name="$1" exe="$build_dir/fuzz_$1" corpus="$work/corpus/$1" rc=0
  mkdir -p "$corpus"
  if [ -d "$root/tests/fuzz/corpus/$name" ]; then
    cp -r "$root/tests/fuzz/corpus/$name/." "$corpus/"
  fi
  local args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1
              -artifact_prefix="$work/findings/$name-")
  [ -f "$root/tests/fuzz/dict/$name.dict" ] && args+=(-dict="$root/tests/fuzz/dict/$name.dict")
  # The harness runs in its own folder under the work folder, and its scratch files (kept when a
  # finding ends it) go there too: nothing lands in the repository or stays behind in /tmp, and
  # harnesses running side by side never share a file.
  mkdir -p "$work/run/$name/tmp"
  (cd "$work/run/$name" && TMPDIR="$work/run/$name/tmp" "$exe" "${args[@]}" "$corpus") \
    >"$work/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$name.rc"
}

# The harnesses are single-threaded: TITAN_FUZZ_JOBS of them (default: one per core) run at once.
jobs="${TITAN_FUZZ_JOBS:-$(nproc)}"
fuzz_start=$SECONDS
running=0
for name in "${harnesses[@]}"; do
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
  run_harness "$name" &
  running=$((running + 1))
done
wait || true

findings=0
summary=""
for name in "${harnesses[@]}"; do
  exe="$build_dir/fuzz_$name"
  log="$work/$name.log"
  rc="$(cat "$work/$name.rc" 2>/dev/null || echo "?")"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  if [ "$rc" != 0 ]; then
    findings=$((findings + 1))
    input="$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)"
    echo "[fuzz] FINDING in fuzz_$name (exit $rc): input ${input:-<none written>}"
    grep -E -A30 "ERROR: |runtime error|uncaught exception|terminate called" "$log" |
      head -60 || true
    echo "[fuzz] full log: $log; replay: $exe ${input:-}"
    summary+="$(printf '%-18s %12s  FINDING %s' "$name" "${execs:-?}" "${input:-}")"$'\n'
  else
    summary+="$(printf '%-18s %12s  ok' "$name" "${execs:-?}")"$'\n'
  fi
done
echo "[fuzz] ${seconds} s per harness, $jobs at a time ($((SECONDS - fuzz_start)) s); executions run:"
printf '%s' "$summary"
if [ "$findings" -ne 0 ]; then
  echo "[fuzz] $findings harness(es) found problems; inputs under $work/findings" >&2
  exit 1
fi
# Nothing found: the scratch corpora are not worth keeping unless the caller chose the folder.
[ -n "${TITAN_FUZZ_WORK_DIR:-}" ] || rm -rf "$work"
