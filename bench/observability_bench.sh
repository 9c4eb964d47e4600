#!/usr/bin/env bash
# What looking inside a run costs: tokens/s of whole training runs of the debug model (seq 256,
# local batch 4, STEPS steps, default 20, logged every step) with each observability feature off
# and on, each variant run REPEATS times (default 2) in turn, so that the pairs share the
# machine's state. tokens/s is the harmonic mean of the per-step figures of steps 3..STEPS (the
# tokens over the time), per rank.
#   one process:  off | TensorBoard | profiler (TorchTitan's schedule: every 10 steps, 3 warm-up
#                 steps and 1 recorded) | memory snapshot (a timeline every 10 steps)
#   2 processes, FSDP 2:  flight recorder off (comm.trace_buf_size 0) | on (20000)
#   BASELINE=path/to/older/titan adds that binary with everything off (the cost of the code being
#   there at all: spans and hooks that stay inactive).
# Prints a table and the on/off ratios. A benchmark, not a test: it never fails on speed.
#   bench/observability_bench.sh                 # build/titan
#   STEPS=30 REPEATS=3 BASELINE=/tmp/old/titan bench/observability_bench.sh
#   VARIANTS="off baseline_off" REPEATS=4 BASELINE=... bench/observability_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
titan="${TITAN:-$root/build/titan}"
steps="${STEPS:-20}"
repeats="${REPEATS:-2}"
[ -x "$titan" ] || bash "$root/scripts/setup.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

common=(--job.config_file "$root/configs/llama3/debug_model.toml"
        --model.hf_assets_path "$root/assets/tokenizer/sotu_2k" --training.steps "$steps"
        --training.local_batch_size 4 --training.seq_len 256 --validation.enable false
        --metrics.log_freq 1 --metrics.disable_color_printing --metrics.peak_flops 1e12
        --lr_scheduler.warmup_steps 2)

declare -A args
names=(off tensorboard profiler memory_snapshot)
args[off]=""
args[tensorboard]="--metrics.enable_tensorboard"
args[profiler]="--profiling.enable_profiling"
args[memory_snapshot]="--profiling.enable_memory_snapshot"
names+=(fsdp2_recorder_off fsdp2_recorder_on)
args[fsdp2_recorder_off]="--comm.trace_buf_size 0"
args[fsdp2_recorder_on]="--comm.trace_buf_size 20000"
if [ -n "${BASELINE:-}" ]; then names+=(baseline_off); args[baseline_off]=""; fi
# VARIANTS="off baseline_off" runs a subset (its reference, off or fsdp2_recorder_off, included).
if [ -n "${VARIANTS:-}" ]; then
  # shellcheck disable=SC2206
  names=(${VARIANTS})
fi

# Harmonic mean of the "tps" of steps 3.. in a metrics.jsonl.
tps_of() {
  awk '/"tps":/ { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0;
                  match($0, /"tps":[0-9.eE+-]+/); v = substr($0, RSTART + 6, RLENGTH - 6) + 0;
                  if (s >= 3 && v > 0) { n++; inv += 1 / v } }
       END { if (n) printf "%.0f", n / inv; else print "nan" }' "$1"
}

declare -A results
for ((r = 1; r <= repeats; r++)); do
  for name in "${names[@]}"; do
    dir="$work/$name-$r"
    bin="$titan"
    [ "$name" = baseline_off ] && bin="$BASELINE"
    # shellcheck disable=SC2206
    extra=(${args[$name]})
    if [[ "$name" == fsdp2_* ]]; then
      "$bin" run --nproc_per_node 2 -- train "${common[@]}" "${extra[@]}" \
        --parallelism.data_parallel_shard_degree 2 --job.dump_folder "$dir" >"$dir.log" 2>&1 ||
        { tail -20 "$dir.log"; exit 1; }
    else
      "$bin" train "${common[@]}" "${extra[@]}" --job.dump_folder "$dir" >"$dir.log" 2>&1 ||
        { tail -20 "$dir.log"; exit 1; }
    fi
    results[$name]="${results[$name]:-} $(tps_of "$dir/metrics.jsonl")"
    echo "run $r $name: ${results[$name]##* } tokens/s" >&2
  done
done

mean() { awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.0f", s / NF }' <<<"$1"; }
echo
echo "| variant | tokens/s (each run) | mean | / off |"
echo "|---|---|---|---|"
for name in "${names[@]}"; do
  ref=off
  [[ "$name" == fsdp2_* ]] && ref=fsdp2_recorder_off
  m="$(mean "${results[$name]}")"
  ratio="$(awk -v a="$m" -v b="$(mean "${results[$ref]}")" 'BEGIN { printf "%.3f", a / b }')"
  echo "| $name | ${results[$name]# } | $m | $ratio |"
done
