#!/usr/bin/env bash
# Pipeline-parallelism benchmark: the seven schedules at pp 2 (2 processes x 1 thread on this
# machine's cores) against one process x 1 thread without PP, float32, model (a) of run_bench.sh
# (flavor bench_small: dim 256, 6 layers, vocab 8192; the debug config's selective activation
# checkpointing) on the sotu corpus, seq 256, batch 8 per step (8 microbatches of 1 under PP),
# validation and checkpoints off. Per schedule it prints the stages per rank, the microbatches,
# the theoretical bubble (the closed form (p-1)/(m+p-1) for GPipe and 1F1B, else
# `titan pipeline-schedule`'s simulation with costs F=1 B=2 I=1 W=1, which are this runtime's
# since it splits I from W), the simulated bubble without that split (I runs the whole backward,
# W nothing: F=1 B=2 I=2 W=0, the costs before the split, for comparison), the measured bubble
# (mean over ranks of the share of the step time each rank was blocked on pipeline receives and
# sends, over all steps; then each rank's), tokens/s per device (mean of the steps after the first
# two), its ratio to 1F1B, each rank's peak RSS, and the CPU share (CPU seconds of all ranks over
# wall seconds x ranks, start-up included: a rank blocked on a receive sleeps, so on an idle
# machine it is near 1 minus the measured bubble; well below that, the ranks waited for a core
# taken by other work, and every figure of that row is skewed). Baselines: one process on the
# whole batch, and one process on 8 accumulated microbatches of 1 (the microbatch size PP runs
# at). A benchmark, not a test: it never fails on speed.
#   bench/pipeline_bench.sh [path/to/titan] [STEPS]      STEPS defaults to 10
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
titan="${1:-build/titan}"
steps="${2:-10}"
[ -x "$titan" ] || { echo "error: $titan not found; build it (scripts/setup.sh)" >&2; exit 1; }
[ "$steps" -ge 3 ] 2>/dev/null || { echo "error: STEPS must be >= 3 (2 are warm-up)" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

pp=2
microbatches=8
common=(--job.config_file configs/llama3/debug_model.toml --model.flavor bench_small
  --training.seq_len 256 --training.steps "$steps" --training.num_threads 1
  --training.mixed_precision_param float32 --validation.enable false --checkpoint.enable false
  --metrics.log_freq 1 --metrics.save_for_all_ranks true --metrics.disable_color_printing true
  --lr_scheduler.warmup_steps 2)

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # mean_of, last_of
# the bubble fraction `titan pipeline-schedule` simulates for SCHEDULE, stages per rank, COSTS
simulated() {
  "$titan" pipeline-schedule --schedule "$1" --pp $pp --microbatches $microbatches \
    --stages-per-rank "$2" --costs "$3" | sed -nE 's/^bubble fraction ([0-9.]+)$/\1/p' | grep .
}

# train NAME NRANKS ARGS...: one run into $out/NAME; on failure shows its log and stops.
train() {
  local name="$1" ranks="$2"; shift 2
  local cmd=("$titan" train)
  [ "$ranks" = 1 ] || cmd=("$titan" run --nproc_per_node "$ranks" -- train)
  local TIMEFORMAT='%R %U %S'  # wall, user and system seconds of the run and all its ranks
  if ! { time LOG_RANK=all "${cmd[@]}" "${common[@]}" "$@" --job.dump_folder "$out/$name" \
      >"$out/$name.log" 2>&1; } 2>"$out/$name.time"; then
    echo "error: $name failed: ${cmd[*]} ... $*" >&2; tail -n 30 "$out/$name.log" >&2; exit 1
  fi
  for ((r = 0; r < ranks; r++)); do
    [ -s "$out/$name/metrics_rank_$r.jsonl" ] ||
      { echo "error: $name: rank $r wrote no metrics" >&2; tail -n 30 "$out/$name.log" >&2
        exit 1; }
  done
}

rows=()  # "label|stages|microbatches|theory|sim_runtime|measured|tps|mem|cpu"
# CPU seconds of the run over wall seconds x ranks
cpu_share() {
  awk -v r="$2" '{ printf "%.2f", ($2 + $3) / ($1 * r) }' "$out/$1.time"
}
# peak RSS of every rank, "0.53/0.55"
memory() {
  local name="$1" ranks="$2" m="" r
  for ((r = 0; r < ranks; r++)); do
    m+="${m:+/}$(printf '%.2f' "$(last_of "$out/$name/metrics_rank_$r.jsonl" memory_gib)")"
  done
  echo "$m"
}

# baseline NAME LABEL MICROBATCHES: the row of a one-process run
baseline() {
  local tps; tps=$(mean_of "$out/$1/metrics_rank_0.jsonl" tps 2)
  rows+=("$2|-|$3|-|-|-|$tps|$(memory "$1" 1)|$(cpu_share "$1" 1)")
}

train single 1 --training.local_batch_size 8
baseline single "1 process, batch 8" 1
train accum 1 --training.local_batch_size 1 --training.global_batch_size 8
baseline accum "1 process, 8 x 1 accumulated" 8

schedules=(GPipe 1F1B Interleaved1F1B LoopedBFS InterleavedZeroBubble ZBVZeroBubble DualPipeV)
for schedule in "${schedules[@]}"; do
  train "$schedule" $pp --parallelism.pipeline_parallel_degree $pp \
    --parallelism.data_parallel_shard_degree 1 \
    --parallelism.pipeline_parallel_schedule "$schedule" \
    --training.local_batch_size $microbatches --parallelism.pipeline_parallel_microbatch_size 1
  log="$out/$schedule.log"
  # "pipeline: 1F1B over pp 2, 2 stages placed loop-style; ...; 8 microbatches of 1"
  line=$(grep -m1 'pipeline: .* stages placed' "$log") ||
    { echo "error: $schedule: no pipeline layout line in its log" >&2; exit 1; }
  n_stages=$(sed -E 's/.* over pp [0-9]+, ([0-9]+) stages placed.*/\1/' <<< "$line")
  mbs=$(sed -E 's/.*; ([0-9]+) microbatches of.*/\1/' <<< "$line")
  [ "$mbs" = $microbatches ] || { echo "error: $schedule ran $mbs microbatches" >&2; exit 1; }
  per_rank=$((n_stages / pp))
  if [ "$per_rank" = 1 ]; then
    theory=$(awk -v p=$pp -v m=$microbatches 'BEGIN { printf "%.4f", (p - 1) / (m + p - 1) }')
  else
    theory=$(simulated "$schedule" $per_rank 1,2,1,1)
  fi
  runtime=$(simulated "$schedule" $per_rank 1,2,2,0)  # without the split, for comparison
  # "[rank 1] ... parallelism: blocked in collectives 108.2 ms per step (5.89% of the step time)"
  blocked=$(sed -nE \
    's/.*blocked in collectives [0-9.eE+-]+ ms per step \(([0-9.eE+-]+)% .*/\1/p' "$log")
  [ "$(wc -l <<< "$blocked")" = $pp ] ||
    { echo "error: $schedule: expected $pp 'blocked in collectives' lines" >&2; exit 1; }
  # "0.1629 (0.28/0.05)": the mean, then each rank's share
  measured=$(awk '{ s += $1; r = r (NR > 1 ? "/" : "") sprintf("%.2f", $1 / 100) }
    END { printf "%.4f (%s)", s / NR / 100, r }' <<< "$blocked")
  tps=$(mean_of "$out/$schedule/metrics_rank_0.jsonl" tps 2)
  rows+=("$schedule|$per_rank|$mbs|$theory|$runtime|$measured|$tps|$(memory "$schedule" $pp)")
  rows[-1]+="|$(cpu_share "$schedule" $pp)"
done

ref=""
for row in "${rows[@]}"; do
  IFS='|' read -r label _ _ _ _ _ tps _ <<< "$row"
  [ "$label" != 1F1B ] || ref=$tps
done
echo "# pp $pp (2 processes x 1 thread), $(nproc) cores; float32; bench_small, seq 256, batch 8;" \
  "$steps steps, tokens/s over the last $((steps - 2)); bubbles as fractions of the step time"
fmt='%-29s %6s %3s %7s %8s %20s %9s %7s %10s %5s\n'
printf "$fmt" schedule stages mb theory nosplit measured 'tok/s/dev' vs_1F1B 'peak_GiB' cpu
for row in "${rows[@]}"; do
  IFS='|' read -r label stages mb theory runtime measured tps mem cpu <<< "$row"
  printf "$fmt" "$label" "$stages" "$mb" "$theory" "$runtime" "$measured" \
    "$(printf '%.0f' "$tps")" "$(awk -v a="$tps" -v b="$ref" 'BEGIN { printf "%.2f", a / b }')" \
    "$mem" "$cpu"
done
