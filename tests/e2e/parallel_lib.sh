# Shared by the parallelism end-to-end tests (sourced after nothing else): a short float32 run of
# the narrow debug model (debugmodel_narrow: debugmodel at dim 128; seq 64, global batch 8, 10
# steps, one validation batch every 5 steps, checkpoints at 5 and 10) in any layout, and comparisons
# of loss curves and final parameters against another run.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

common=(--job.config_file configs/llama3/debug_model.toml --model.flavor debugmodel_narrow
  --training.steps 10 --training.seq_len 64 --training.global_batch_size 8
  --training.mixed_precision_param float32
  --metrics.log_freq 1 --metrics.peak_flops 1e12 --validation.freq 5 --validation.steps 1
  --lr_scheduler.warmup_steps 3 --checkpoint.enable true --checkpoint.interval 5
  --checkpoint.last_save_model_only false)

# train NAME NPROC ARGS...: one run into $WORK/NAME (metrics.jsonl, checkpoint/step-N).
train() {
  local name="$1" n="$2"; shift 2
  local cmd=("$TITAN" train)
  [ "$n" = 1 ] || cmd=("$TITAN" run --nproc_per_node "$n" -- train)
  expect_exit 0 timeout 300 "${cmd[@]}" "${common[@]}" --job.dump_folder "$WORK/$name" "$@"
  cp "$WORK/out" "$WORK/$name.log"
}

# same_losses REF NAME KEY [TOL]: every KEY value of NAME's metrics equals REF's within TOL
# relative (default 1e-5).
same_losses() {
  local ref="$WORK/$1/metrics.jsonl" got="$WORK/$2/metrics.jsonl" key="$3" tol="${4:-1e-5}"
  paste -d' ' <(grep "\"$key\":" "$ref" | sed -E "s/.*\"$key\":(-?[0-9.eE+-]+).*/\1/") \
    <(grep "\"$key\":" "$got" | sed -E "s/.*\"$key\":(-?[0-9.eE+-]+).*/\1/") |
    awk -v name="$2" -v key="$key" -v tol="$tol" '
      NF != 2 { print name ": " key " count differs"; bad = 1; next }
      { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r
        if (r > tol) { print name ": " key " line " NR ": " $1 " vs " $2; bad = 1 } n++ }
      END { if (n == 0) { print name ": no " key; bad = 1 }
            printf "%s: %d %s values within %.1e relative\n", name, n, key, worst; exit bad }' ||
    fail "$2 does not reproduce the single-process $key curve"
}

same_params() {
  "$TITAN" convert diff "$WORK/$1/checkpoint/step-10" "$WORK/$2/checkpoint/step-10" \
    --atol 3e-4 --rtol 1e-4 >"$WORK/out" 2>&1 || { cat "$WORK/out" >&2; fail "$2: final parameters"; }
  echo "$2: final parameters $(tail -n 1 "$WORK/out")"
}


# resume_from REF STEP NAME NPROC ARGS...: trains NAME from a copy of REF's step-STEP checkpoint;
# its losses must be REF's for the steps after STEP.
resume_from() {
  local ref="$1" step="$2" name="$3"; shift 3
  rm -rf "${WORK:?}/$name"
  mkdir -p "$WORK/$name/checkpoint" "$WORK/${name}_ref"
  cp -r "$WORK/$ref/checkpoint/step-$step" "$WORK/$name/checkpoint/"
  train "$name" "$@"
  grep -q "resuming training after step $step" "$WORK/$name.log" || fail "$name did not resume"
  grep '"loss":' "$WORK/$ref/metrics.jsonl" | tail -n +$((step + 1)) >"$WORK/${name}_ref/metrics.jsonl"
  same_losses "${name}_ref" "$name" loss
}

# kill_rank_1_mid_run NAME ARGS...: a 2-process run into $WORK/NAME whose rank 1 is killed with
# SIGKILL after step 3; the job must end non-zero, the launcher naming rank 1.
kill_rank_1_mid_run() {
  local name="$1"; shift
  local start; start=$(date +%s)
  set +e
  timeout 120 "$TITAN" run --nproc_per_node 2 -- train "${common[@]}" --training.steps 100000 \
    --checkpoint.enable false --job.dump_folder "$WORK/$name" "$@" >"$WORK/$name.log" 2>&1 &
  local launcher=$!
  set -e
  for _ in $(seq 1 600); do
    grep -qE 'step: +3 ' "$WORK/$name.log" 2>/dev/null && break
    sleep 0.1
  done
  local victim="" pid
  for pid in $(pgrep -f "dump_folder $WORK/$name" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'RANK=1'; then victim=$pid; fi
  done
  [ -n "$victim" ] || { cat "$WORK/$name.log" >&2; fail "could not find rank 1"; }
  kill -KILL "$victim"
  local code
  set +e; wait "$launcher"; code=$?; set -e
  local elapsed=$(( $(date +%s) - start ))
  [ "$code" != 0 ] && [ "$code" != 124 ] || { cat "$WORK/$name.log" >&2; fail "killed rank: exit $code"; }
  grep -q 'rank 1 .*killed by signal 9\|rank 1.*SIGKILL\|rank 1 .*signal' "$WORK/$name.log" ||
    { cat "$WORK/$name.log" >&2; fail "the launcher did not name rank 1"; }
  echo "$name: rank 1 killed after step 3; job exited $code after ${elapsed}s in all"
}
