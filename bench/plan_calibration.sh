#!/usr/bin/env bash
# Calibration of `titan plan --cpu` on this machine: trains the layouts of the parallelism
# end-to-end tests (debug model, seq 64, global batch 8, float32, selective AC every 2nd block;
# one process, FSDP 2, DDP 2, TP 2, PP 2, CP 2, FSDP 2 x TP 2) and a bigger flavor, takes the
# best tokens/s per rank over the steady steps of REPEATS rounds (each round runs every layout
# once, so that a busy spell of the shared cores hits all of them alike) and the peak RSS of rank 0, and prints them beside the planner's predictions and the
# relative errors. One figure is fitted: the compute efficiency (--mfu), from the single-process
# run of each model; the peak is this machine's GEMM probe, the link its measured Gloo loopback
# bandwidth (both from `titan plan --cpu`). Memory is predicted as the planner's estimate plus
# the runtime's resident size (the plan process's own, before any model). A benchmark: it prints,
# it never fails on accuracy.
#   bench/plan_calibration.sh [REPEATS] [STEPS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
repeats="${1:-2}"
steps="${2:-12}"
titan="$root/build/titan"
[ -x "$titan" ] || bash "$root/scripts/setup.sh"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cores=$(nproc)

# field FILE PATTERN: the first sed capture of PATTERN in FILE.
field() { sed -nE "s/$2/\1/p" "$1" | head -n 1; }

# best KEY FILE...: the largest KEY over the steps after the first two of every file.
best() {
  local key="$1"; shift
  for f in "$@"; do grep "\"$key\":" "$f" | tail -n +3; done |
    sed -E "s/.*\"$key\":(-?[0-9.eE+-]+).*/\1/" | sort -g | tail -n 1
}

# The machine once: GEMM peak of all cores, loopback bandwidth of 2 ranks.
"$titan" plan --cpu --gpus_per_node 1 --model.flavor debugmodel --training.seq_len 64 \
  --training.global_batch_size 8 --training.mixed_precision_param float32 >"$out/probe1"
machine_tflops=$(field "$out/probe1" '.* ([0-9.e+-]+) TFLOP\/s peak.*')
"$titan" plan --cpu --gpus_per_node 2 --model.flavor debugmodel --training.seq_len 64 \
  --training.global_batch_size 8 --training.mixed_precision_param float32 >"$out/probe2"
loop_gbps=$(field "$out/probe2" '.*, ([0-9.e+-]+) GB\/s in a node.*')
echo "this machine: $cores cores, GEMM probe $machine_tflops TFLOP/s (float32, all cores)," \
  "Gloo loopback all-gather $loop_gbps GB/s (2 ranks)"

# layouts: NAME PROCS FLAVOR SEQ then the parallelism / batch overrides
layouts=(
  "single|1|debugmodel|64|--training.local_batch_size 8"
  "fsdp2|2|debugmodel|64|--training.local_batch_size 4"
  "ddp2|2|debugmodel|64|--training.local_batch_size 4 --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1"
  "tp2|2|debugmodel|64|--training.local_batch_size 8 --parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2"
  "pp2_1f1b|2|debugmodel|64|--training.local_batch_size 8 --parallelism.data_parallel_shard_degree 1 --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B"
  "cp2|2|debugmodel|64|--training.local_batch_size 8 --parallelism.data_parallel_shard_degree 1 --parallelism.context_parallel_degree 2"
  "fsdp2_tp2|4|debugmodel|64|--training.local_batch_size 4 --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2"
  "single|1|bench_medium|256|--training.local_batch_size 8"
  "fsdp2|2|bench_medium|256|--training.local_batch_size 4"
  "tp2|2|bench_medium|256|--training.local_batch_size 8 --parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2"
)
fixed=(--parallelism.data_parallel_replicate_degree 1 --parallelism.data_parallel_shard_degree -1
  --parallelism.context_parallel_degree 1 --parallelism.tensor_parallel_degree 1
  --parallelism.pipeline_parallel_degree 1 --activation_checkpoint.mode selective
  --activation_checkpoint.selective_ac_option 2)

# job ENTRY: sets name procs flavor seq, the layout's overrides and the common ones.
job() {
  IFS='|' read -r name procs flavor seq extra <<<"$1"
  # shellcheck disable=SC2206
  layout=(${fixed[@]} $extra)
  common=(--job.config_file configs/llama3/debug_model.toml --model.flavor "$flavor"
    --training.seq_len "$seq" --training.global_batch_size 8 --training.steps "$steps"
    --training.mixed_precision_param float32 --metrics.log_freq 1 --validation.enable false
    --checkpoint.enable false --lr_scheduler.warmup_steps 2)
}

for r in $(seq 1 "$repeats"); do
  for entry in "${layouts[@]}"; do
    job "$entry"
    dir="$out/$flavor-$name-$r"
    cmd=("$titan" train)
    [ "$procs" = 1 ] || cmd=("$titan" run --nproc_per_node "$procs" -- train)
    "${cmd[@]}" "${common[@]}" "${layout[@]}" --job.dump_folder "$dir" >"$dir.log" 2>&1 ||
      { cat "$dir.log" >&2; exit 1; }
  done
done

printf '%-12s %-9s %5s %12s %12s %8s %11s %11s %8s\n' model layout procs 'tok/s meas' \
  'tok/s pred' error 'GiB meas' 'GiB pred' error
mfu=""
for entry in "${layouts[@]}"; do
  job "$entry"
  files=("$out/$flavor-$name"-*/metrics.jsonl)
  tps=$(best tps "${files[@]}")
  gib=$(best memory_gib "${files[@]}")
  per_rank_tflops=$(awk -v t="$machine_tflops" -v n="$procs" 'BEGIN { printf "%.6g", t / n }')
  link=$(awk -v b="$loop_gbps" -v c="$cores" -v n="$procs" 'BEGIN { f = c / n; if (f > 1) f = 1; printf "%.6g", b * f }')
  plan=("$titan" plan --cpu --gpus_per_node "$procs" --peak_tflops "$per_rank_tflops"
    --intra_node_gbps "$link" "${common[@]}" "${layout[@]}" --top 1)
  if [ "$name" = single ]; then
    # The one fitted figure: the efficiency that makes the single-process prediction exact.
    "${plan[@]}" --mfu 1 >"$out/plan"
    at_one=$(field "$out/plan" '^   tokens\/s per device ([0-9,]+),.*' | tr -d ,)
    mfu=$(awk -v m="$tps" -v p="$at_one" 'BEGIN { printf "%.4f", m / p }')
    echo "-- $flavor: calibrated --mfu $mfu (measured single-process tokens/s / predicted at MFU 1)"
  fi
  "${plan[@]}" --mfu "$mfu" >"$out/plan"
  pred=$(field "$out/plan" '^   tokens\/s per device ([0-9,]+),.*' | tr -d ,)
  est=$(field "$out/plan" '^   memory per device ([0-9.]+) GiB.*')
  runtime=$(field "$out/plan" '.*GiB \(([0-9.]+) GiB reserved\).*')
  pred_gib=$(awk -v a="$est" -v b="$runtime" 'BEGIN { printf "%.3f", a + b }')
  awk -v f="$flavor" -v n="$name" -v p="$procs" -v mt="$tps" -v pt="$pred" -v mg="$gib" -v pg="$pred_gib" \
    'BEGIN { printf "%-12s %-9s %5d %12.0f %12.0f %+7.1f%% %11.3f %11.3f %+7.1f%%\n",
             f, n, p, mt, pt, 100 * (pt / mt - 1), mg, pg, 100 * (pg / mg - 1) }'
done
