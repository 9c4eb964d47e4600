# Shared helpers for the end-to-end tests: each test_*.sh gets the titan binary as $1 and runs
# from the repository root. Outputs go to a fresh temporary folder removed on exit.
set -euo pipefail
TITAN="${1:?usage: $0 path/to/titan}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_exit CODE CMD...: runs CMD, captures output in $WORK/out, checks the exit code. With
# TITAN_E2E_TIMES=FILE, appends "<seconds> <test> <command>" to FILE (where the CI time goes).
expect_exit() {
  local want="$1"; shift
  local t0=$EPOCHREALTIME
  set +e
  "$@" >"$WORK/out" 2>&1
  local got=$?
  set -e
  if [ -n "${TITAN_E2E_TIMES:-}" ]; then
    awk -v a="$t0" -v b="$EPOCHREALTIME" -v t="$(basename "$0" .sh)" -v c="${*:1:14}" \
      'BEGIN { printf "%.1f %s %s\n", b - a, t, c }' >>"$TITAN_E2E_TIMES"
  fi
  if [ "$got" != "$want" ]; then
    cat "$WORK/out" >&2
    fail "expected exit $want, got $got: $*"
  fi
}

# start_watchdog SECONDS PID: SIGKILLs PID after SECONDS unless stop_watchdog comes first; sets
# $watchdog. The watchdog writes nowhere: a background sleep that held the test's stdout would keep
# ctest waiting on the pipe until the sleep ended, long after the test itself.
start_watchdog() {
  (sleep "$1"; kill -KILL "$2" 2>/dev/null) >/dev/null 2>&1 &
  watchdog=$!
}
stop_watchdog() {  # the watchdog's sleep, then the watchdog
  pkill -P "$watchdog" sleep 2>/dev/null || true
  kill "$watchdog" 2>/dev/null || true
}

# free_port: a TCP port for a rendezvous store started by hand (rank 0 binds it), below the
# kernel's ephemeral range, whose ports other tests' client sockets take at random (a random port
# in it once collided: rank 0 could not bind, rank 1 waited for a store that never came), and
# that no socket of this host uses now.
free_port() {
  local lo rest base p i
  read -r lo rest </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=32768
  base=20000
  [ "$lo" -gt $((base + 1000)) ] || base=10000
  for i in $(seq 1 100); do
    p=$((base + RANDOM % (lo - base)))
    grep -qi "$(printf ':%04X ' "$p")" /proc/net/tcp /proc/net/tcp6 2>/dev/null || { echo "$p"; return; }
  done
  fail "free_port: no unused port in [$base, $lo)"
}

# expect_output PATTERN: grep -E PATTERN in the last captured output.
expect_output() {
  grep -qE -- "$1" "$WORK/out" || { cat "$WORK/out" >&2; fail "output lacks /$1/"; }
}

# json_field FILE KEY N: value of KEY in the N-th line (1-based; -1 = last) of a JSONL file that
# has KEY, using only awk.
json_field() {
  local file="$1" key="$2" n="$3"
  grep "\"$key\":" "$file" | { if [ "$n" = "-1" ]; then tail -n 1; else sed -n "${n}p"; fi; } |
    sed -E "s/.*\"$key\":(-?[0-9.eE+-]+).*/\1/"
}

# python_and_tests BINARY: sets PY (the project's Python, $TITAN_PYTHON) and TESTS (the unit-test
# BINARY beside $TITAN) for tests that check a unit test against a Python reference's fixture.
python_and_tests() {
  PY="${TITAN_PYTHON:-}"
  [ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh --print)\" bash $0 $TITAN"
  TESTS="$(dirname "$TITAN")/$1"
  [ -x "$TESTS" ] || fail "no $TESTS beside $TITAN (build the unit tests)"
  export OMP_NUM_THREADS=2
}

# train_run NAME NPROC ARGS...: `titan train ARGS` (under `titan run --nproc_per_node NPROC` when
# NPROC > 1) dumping into $WORK/NAME, its output kept in $WORK/NAME.log; fails on a non-zero exit.
train_run() {
  local name="$1" n="$2"; shift 2
  local cmd=("$TITAN" train)
  [ "$n" = 1 ] || cmd=("$TITAN" run --nproc_per_node "$n" -- train)
  expect_exit 0 timeout 300 "${cmd[@]}" --job.dump_folder "$WORK/$name" "$@"
  cp "$WORK/out" "$WORK/$name.log"
}

# metric_values RUN KEY: the KEY values of $WORK/RUN/metrics.jsonl, one per line.
metric_values() { grep "\"$2\":" "$WORK/$1/metrics.jsonl" | sed -E "s/.*\"$2\":(-?[0-9.eE+-]+).*/\1/"; }

# same_values REF RUN KEY TOL: RUN's KEY values equal REF's within TOL relative (as many, more
# than none), printing the largest difference; fails otherwise.
same_values() {
  paste -d' ' <(metric_values "$1" "$3") <(metric_values "$2" "$3") |
    awk -v n="$2" -v k="$3" -v tol="$4" '
    NF != 2 { bad = 1; next }
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > w) w = r; c++
      if (r > tol) bad = 1 }
    END { printf "%s: %d %s values within %.1e relative\n", n, c, k, w; exit bad || c == 0 }' ||
    fail "$2 does not reproduce the one-process $3 values"
}

# same_as_one RUN: RUN's losses and validation losses equal $WORK/one's within 1e-5 relative,
# its step-10 parameters within 3e-4 + 1e-4 relative.
same_as_one() {
  same_values one "$1" loss 1e-5
  same_values one "$1" validation_loss 1e-5
  "$TITAN" convert diff "$WORK/one/checkpoint/step-10" "$WORK/$1/checkpoint/step-10" \
    --atol 3e-4 --rtol 1e-4 >"$WORK/out" 2>&1 || { cat "$WORK/out" >&2; fail "$1 parameters"; }
  echo "$1: final parameters $(tail -n 1 "$WORK/out")"
}

# data_parallel_parity UNITS ARGS...: with ARGS (10 steps, validation, checkpoints at steps 5 and
# 10), one process (local batch 8), FSDP over 2 ranks (UNITS units) and DDP over 2 (local batch
# 4): the 2-rank runs' losses and validation losses equal the one process's within 1e-5 relative
# and their step-10 parameters within 3e-4 + 1e-4 relative; a run resumed from the one process's
# step-5 checkpoint repeats its last 5 losses within 1e-6 (REPEAT_TOL). Leaves the runs in
# $WORK/one, fsdp2, ddp2, resumed.
#
# REPEAT_TOL: runs that repeat another's steps in one process (a resume, the same weights from
# another format, precomputed encodings) give the same bits. Once, on a loaded 2-core Intel Xeon,
# a FLUX first step came out 3e-6 off: oneMKL's first-call race in its vector math, which the
# titan binary now avoids at start-up (warm_up_vector_math, titan/common/cpu.h). A real fault (a
# lost optimizer or scheduler state, the wrong generator or data position) moves losses by far
# more.
REPEAT_TOL=1e-6
data_parallel_parity() {
  local units="$1"; shift
  train_run one 1 "$@" --training.local_batch_size 8
  train_run fsdp2 2 "$@" --training.local_batch_size 4 --validation.local_batch_size 4
  grep -q "FSDP: sharded over 2 ranks ($units units" "$WORK/fsdp2.log" || fail "no FSDP line"
  train_run ddp2 2 "$@" --training.local_batch_size 4 --validation.local_batch_size 4 \
    --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1
  same_as_one fsdp2
  same_as_one ddp2
  mkdir -p "$WORK/resumed/checkpoint"
  cp -r "$WORK/one/checkpoint/step-5" "$WORK/resumed/checkpoint/"
  train_run resumed 1 "$@" --training.local_batch_size 8
  grep -q "resuming training after step 5" "$WORK/resumed.log" || fail "no resume"
  grep '"loss":' "$WORK/one/metrics.jsonl" | tail -n 5 >"$WORK/tail5"
  mkdir -p "$WORK/one_tail" && mv "$WORK/tail5" "$WORK/one_tail/metrics.jsonl"
  same_values one_tail resumed loss "$REPEAT_TOL"
}
