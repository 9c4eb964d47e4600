# The launcher: `titan run` prefixes each rank's lines and shows stdout only for LOG_RANK ranks;
# one failing rank (exit 1, exception, abort, kill -9) brings the job down non-zero within seconds
# naming the rank; a hung rank ends the job through comm.init/train_timeout_seconds; SIGTERM and
# kill -9 of the launcher take the ranks with it; ranks started by hand with torchrun, SLURM and
# OpenMPI variables rendezvous and pass the selftest. Every command runs under `timeout 60`.
source "$(dirname "$0")/lib.sh"
marker="launcher-test-$$"  # in every rank's command line, to find leftover processes

# timed CODE CMD...: expect_exit with the elapsed seconds in $elapsed.
timed() {
  local start end
  start=$(date +%s.%N)
  expect_exit "$@"
  end=$(date +%s.%N)
  elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
}
faster_than() {
  awk -v e="$elapsed" -v l="$1" 'BEGIN { exit !(e < l) }' || fail "took ${elapsed}s, limit $1s"
}
lacks() { ! grep -qE -- "$1" "$WORK/out" || { cat "$WORK/out" >&2; fail "output has /$1/"; }; }
no_leftovers() {
  sleep 0.5
  local left
  left=$(pgrep -f "$marker" || true)
  if [ -n "$left" ]; then
    ps -o pid,args -p $left >&2 || true
    kill -KILL $left 2>/dev/null || true  # our own processes (unique marker)
    fail "ranks outlived the launcher"
  fi
}
# background_launcher ARGS...: starts `titan run ARGS` in the background as $launcher, with a
# watchdog that kills it after 60 s so the test cannot hang.
background_launcher() {
  "$TITAN" run "$@" >"$WORK/out" 2>&1 &
  launcher=$!
  start_watchdog 60 "$launcher"
}
# wait_for PATTERN: until the background launcher's output matches (at most 30 s).
wait_for() {
  local i
  for i in $(seq 300); do
    grep -qE -- "$1" "$WORK/out" && return 0
    sleep 0.1
  done
  cat "$WORK/out" >&2
  fail "no /$1/ within 30 s"
}

selftest=(selftest --job.description "$marker")

# --- success, output filtering (LOG_RANK=0,2 here; the default, 0, below) ---
timed 0 env LOG_RANK=0,2 timeout 60 "$TITAN" run --nproc_per_node 3 -- "${selftest[@]}"
expect_output '^\[rank 0\] .*launched by titan run'
expect_output '^\[rank 0\] .*selftest passed \(rank 0 of 3\)'
expect_output '^\[rank 0\] .*gloo all_reduce of rank\+1: 6 \(expected 6\)'
expect_output '^\[rank 2\] .*selftest passed \(rank 2 of 3\)'
lacks '^\[rank 1\]'
echo "3 ranks, selftest: ${elapsed}s"

# Any program; stdout of LOG_RANK ranks (default 0), stderr of every rank is shown.
expect_exit 0 timeout 60 "$TITAN" run --nproc_per_node 2 -- sh -c 'echo out-$RANK-$WORLD_SIZE; echo err-$LOCAL_RANK >&2'
expect_output '^\[rank 0\] out-0-2$'
expect_output '^\[rank 1\] err-1$'
lacks 'out-1'

# --- one rank fails: the job ends fast, non-zero, naming the rank ---
# down_after_failure: seconds from the injected failure (t= in its message) to now.
down_after_failure() {
  local t
  t=$(sed -nE 's/.*injected failure.*\(t=([0-9.]+)\).*/\1/p' "$WORK/out" | head -n 1)
  [ -n "$t" ] || { cat "$WORK/out" >&2; fail "no injected failure in the output"; }
  awk -v t="$t" -v now="$(date +%s.%N)" 'BEGIN { printf "%.2f", now - t }'
}
for case in "3 exit 1 exited with code 1" "2 exception 1 exited with code 1" \
            "2 abort 134 was killed by SIGABRT" "3 kill9 137 was killed by SIGKILL"; do
  read -r nproc mode code message <<<"$case"
  timed "$code" timeout 60 "$TITAN" run --nproc_per_node "$nproc" -- "${selftest[@]}" --fail_rank 1 --fail_mode "$mode"
  down=$(down_after_failure)
  expect_output "titan run: rank 1 \(pid [0-9]+\) $message"
  expect_output "sending SIGTERM to the $((nproc - 1)) remaining rank"
  expect_output "titan run: all ranks stopped [0-9.]+ s after rank 1 failed; exit code $code"
  faster_than 30
  awk -v d="$down" 'BEGIN { exit !(d < 10) }' || fail "job took ${down}s to stop after the failure"
  echo "rank 1 of $nproc $mode: job down ${down}s after the failure (whole run ${elapsed}s)"
done
no_leftovers

# A rank that ignores SIGTERM is killed after the grace period (3 s), with what it started.
timed 3 timeout 60 "$TITAN" run --nproc_per_node 2 -- sh -c \
  "trap '' TERM; [ \$RANK = 1 ] && sleep 0.5 && exit 3; sleep 50 # $marker"
expect_output 'titan run: rank 1 \(pid [0-9]+\) exited with code 3'
expect_output 'titan run: rank\(s\) 0 did not stop within 3 s; sending SIGKILL'
faster_than 20
no_leftovers

# --- a hung rank: the others time out (rendezvous, then exchanges) and the job ends ---
timed 1 timeout 60 "$TITAN" run --nproc_per_node 3 -- "${selftest[@]}" --fail_rank 2 --fail_mode hang \
  --fail_at rendezvous --comm.init_timeout_seconds 3
expect_output '^\[rank 0\] .*rendezvous timed out after 3 s \(comm.init_timeout_seconds\): 2 of 3 ranks arrived'
expect_output '^\[rank 1\] .*rendezvous timed out .*; missing: rank 2'
expect_output 'titan run: rank [01] .*exited with code 1'
faster_than 30
echo "rank 2 hangs before joining: job down in ${elapsed}s"

timed 1 timeout 60 "$TITAN" run --nproc_per_node 2 -- "${selftest[@]}" --fail_rank 1 --fail_mode hang \
  --comm.train_timeout_seconds 3
expect_output 'no value from rank 1 within 3 s \(comm.train_timeout_seconds\)'
faster_than 30
echo "rank 1 hangs after joining: job down in ${elapsed}s"
no_leftovers

# --- signals: SIGTERM is forwarded; kill -9 of the launcher takes the ranks with it ---
background_launcher --nproc_per_node 2 -- "${selftest[@]}" --fail_rank 0 --fail_mode hang
wait_for "injected failure 'hang'"
kill -TERM "$launcher"
set +e; wait "$launcher"; code=$?; set -e
stop_watchdog
[ "$code" = 143 ] || { cat "$WORK/out" >&2; fail "SIGTERM: expected exit 143, got $code"; }
expect_output 'titan run: received SIGTERM; sending SIGTERM to the 2 remaining ranks'
no_leftovers

background_launcher --nproc_per_node 2 -- "${selftest[@]}" --fail_rank 0 --fail_mode hang
wait_for "injected failure 'hang'"
kill -KILL "$launcher"
set +e; { wait "$launcher"; } 2>/dev/null; set -e
stop_watchdog
no_leftovers

# --- training refuses a layout the model cannot take, on every rank ---
expect_exit 2 timeout 60 "$TITAN" run --nproc_per_node 2 -- train \
  --job.config_file configs/llama3/debug_model.toml --parallelism.expert_parallel_degree 2
expect_output 'expert_parallel_degree = 2 needs a mixture-of-experts model'

# --- ranks started by hand: torchrun, SLURM and OpenMPI variables ---
# by_hand NAME VARS...: two background ranks; @R@ in VARS is the rank. Both must pass.
by_hand() {
  local name="$1"; shift
  local pids=() r
  for r in 0 1; do
    env "${@//@R@/$r}" timeout 60 "$TITAN" "${selftest[@]}" >"$WORK/$name.$r" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}" || { cat "$WORK/$name.0" "$WORK/$name.1" >&2; fail "$name: rank $r failed"; }
  done
  grep -q "launched by $name" "$WORK/$name.0" || { cat "$WORK/$name.0" >&2; fail "$name: source"; }
  grep -q '^\[rank 0\] .*selftest passed (rank 0 of 2)' "$WORK/$name.0" || fail "$name: rank 0 output"
  ! grep -q 'selftest passed' "$WORK/$name.1" || fail "$name: rank 1 printed info lines (LOG_RANK=0)"
}
by_hand torchrun RANK=@R@ LOCAL_RANK=@R@ WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" TORCHELASTIC_RUN_ID=e2e
job=$(( $(free_port) - 15000 ))  # the store's port from SLURM_JOB_ID: 15000 + job % 20000
by_hand slurm SLURM_PROCID=@R@ SLURM_LOCALID=@R@ SLURM_NTASKS=2 SLURM_NODEID=0 SLURM_JOB_ID=$job \
  SLURM_STEP_TASKS_PER_NODE=2 SLURM_JOB_NODELIST='localhost,node[01-02]'
grep -q "store localhost:$((15000 + job % 20000))" "$WORK/slurm.0" || fail "slurm: port from SLURM_JOB_ID"
by_hand openmpi OMPI_COMM_WORLD_RANK=@R@ OMPI_COMM_WORLD_LOCAL_RANK=@R@ OMPI_COMM_WORLD_SIZE=2 \
  OMPI_COMM_WORLD_LOCAL_SIZE=2 MASTER_PORT="$(free_port)"

# --- two nodes on one host: one `titan run` per node ---
port=$(free_port)
for node in 1 0; do
  env LOG_RANK=all timeout 60 "$TITAN" run --nnodes 2 --node_rank $node --master_addr 127.0.0.1 \
    --master_port "$port" --nproc_per_node 1 -- "${selftest[@]}" >"$WORK/node$node" 2>&1 &
  eval "node${node}_pid=$!"
done
wait "$node0_pid" || { cat "$WORK/node0" "$WORK/node1" >&2; fail "node 0 failed"; }
wait "$node1_pid" || { cat "$WORK/node0" "$WORK/node1" >&2; fail "node 1 failed"; }
grep -q '^\[rank 1\] .*(local 0/1, node 1).*' "$WORK/node1" || fail "node 1: rank 1 on node 1"
grep -q '^\[rank 1\] .*selftest passed (rank 1 of 2)' "$WORK/node1" || fail "node 1: selftest"

# --- the real torchrun, from torch 2.15 of the project environment (scripts/python_env.sh) ---
[ -n "${TITAN_PYTHON:-}" ] || fail "TITAN_PYTHON is not set (ctest sets it; see scripts/python_env.sh)"
expect_exit 0 env LOG_RANK=all timeout 60 "$TITAN_PYTHON" -m torch.distributed.run \
  --nproc_per_node 2 --master_port "$(free_port)" --no_python "$TITAN" "${selftest[@]}"
expect_output '^\[rank 1\] .*launched by torchrun'
expect_output '^\[rank 1\] .*selftest passed \(rank 1 of 2\)'

no_leftovers
echo "launcher: all cases passed"
