#!/usr/bin/env bash
# Expert-parallelism benchmark through the real binary: Qwen3 debugmodel_moe (dim 256, 8 layers,
# 64 experts of hidden 768, top 8) on the sotu corpus with the byte tokenizer, 2 processes x 1
# thread, FSDP over both ranks (dp_shard 2), bf16 compute (so the experts run as grouped GEMMs),
# no activation checkpointing, forced even routing (debug.moe_force_load_balance: every expert
# gets the same tokens, so the all-to-all is balanced and the layouts do the same work),
# validation and checkpoints off, the same global batch in every layout. Layouts: ep 1 (every rank
# holds all experts, FSDP-sharded) and ep 2 (expert_parallel_degree 2: each rank holds half the
# experts, tokens travel by all-to-all). Per layout it prints:
#   tok/s/dev   tokens per second per rank (per device): the mean over ranks of each rank's mean
#               over the steps after the first (warm-up), and the job's figure (x ranks)
#   MFU%        the trainer's MFU (active parameters; peak from its CPU GEMM probe), mean over ranks
#   vs_ep1      tok/s of the layout over ep 1's
#   comm%       the share of the step each rank was blocked in collectives (the trainer's "blocked
#               in collectives", mean over ranks; "-" when the run logged none)
#   peak GiB    the largest peak RSS of the ranks (metrics' memory_gib, the run's high-water mark)
#   cpu         this job's CPU seconds (ranks, start-up included) over wall seconds x ranks
#   cores       this job's cores in use on average, and "+N" the cores other work on the machine
#               kept busy meanwhile (from /proc/stat); a large "+N" means a busy machine
# A benchmark, not a test: it never fails on speed.
#   bench/moe_bench.sh [path/to/titan] [STEPS]    STEPS defaults to 5 (the first is warm-up)
#   EPS="1" SEQ=64 bench/moe_bench.sh build/titan 2    a quick check of the script (ep 1 only)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
titan="${1:-build/titan}"
steps="${2:-5}"
eps=(${EPS:-1 2})
seq="${SEQ:-256}"
local_batch="${LOCAL_BATCH:-2}"
nproc=2
[ -x "$titan" ] || { echo "error: $titan not found; build it (scripts/setup.sh)" >&2; exit 1; }
[ "$steps" -ge 2 ] 2>/dev/null || { echo "error: STEPS must be >= 2 (1 is warm-up)" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

common=(--job.config_file configs/llama3/debug_model.toml --model.name qwen3
  --model.flavor debugmodel_moe --model.hf_assets_path ""
  --training.seq_len "$seq" --training.local_batch_size "$local_batch"
  --training.global_batch_size $((local_batch * nproc)) --training.num_threads 1
  --training.mixed_precision_param bfloat16 --activation_checkpoint.mode none
  --debug.moe_force_load_balance true --validation.enable false --checkpoint.enable false
  --metrics.log_freq 1 --metrics.save_for_all_ranks true --metrics.disable_color_printing true
  --lr_scheduler.warmup_steps 1)

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # mean_of, last_of
# busy and total jiffies of the whole machine ("cpu" line of /proc/stat; idle and iowait are idle)
machine_jiffies() {
  awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' \
    /proc/stat
}
# mean over the ranks of KEY's mean_of in run NAME
rank_mean() {
  local name="$1" key="$2" r
  for ((r = 0; r < nproc; r++)); do mean_of "$out/$name/metrics_rank_$r.jsonl" "$key"; echo; done |
    awk '{ s += $1; n++ } END { printf "%.6g", n ? s / n : 0 }'
}

# train NAME EP: one run into $out/NAME; on failure shows its log and stops.
train() {
  local name="$1" ep="$2"
  local args=(--training.steps "$steps" --parallelism.data_parallel_shard_degree "$nproc")
  [ "$ep" = 1 ] || args+=(--parallelism.expert_parallel_degree "$ep")
  local TIMEFORMAT='%R %U %S'  # wall, user and system seconds of the run and all its ranks
  local before; before=$(machine_jiffies)
  if ! { time LOG_RANK=all "$titan" run --nproc_per_node "$nproc" -- train "${common[@]}" \
      "${args[@]}" --job.dump_folder "$out/$name" >"$out/$name.log" 2>&1; } 2>"$out/$name.time"
  then
    echo "error: $name failed: $titan run --nproc_per_node $nproc -- train ... ${args[*]}" >&2
    tail -n 30 "$out/$name.log" >&2
    exit 1
  fi
  echo "$before $(machine_jiffies)" >"$out/$name.jiffies"
  for ((r = 0; r < nproc; r++)); do
    [ -s "$out/$name/metrics_rank_$r.jsonl" ] ||
      { echo "error: $name: rank $r wrote no metrics" >&2; tail -n 30 "$out/$name.log" >&2
        exit 1; }
  done
}

# "cpu cores +others" of run NAME
cpu_use() {
  local b0 t0 b1 t1
  read -r b0 t0 b1 t1 <"$out/$1.jiffies"
  awk -v r="$nproc" -v mb=$((b1 - b0)) -v cores="$(nproc)" -v mt=$((t1 - t0)) \
    '{ own = ($2 + $3) / $1; busy = mt > 0 ? cores * mb / mt : 0; other = busy - own
       printf "%.2f %.2f +%.2f", ($2 + $3) / ($1 * r), own, (other > 0 ? other : 0) }' \
    "$out/$1.time"
}

echo "# $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
rows=()  # "ep|tps_dev|tps_job|mfu|ratio|comm|peak|cpu cores others"
ref=""
for ep in "${eps[@]}"; do
  name="ep$ep"
  train "$name" "$ep"
  tps=$(rank_mean "$name" tps)
  mfu=$(rank_mean "$name" mfu)
  [ -n "$ref" ] || ref=$tps
  # "[rank 1] ... parallelism: blocked in collectives 43.8 ms per step (5.65% of the step time)"
  comm=$(sed -nE \
    's/.*blocked in collectives [0-9.eE+-]+ ms per step \(([0-9.eE+-]+)% .*/\1/p' \
    "$out/$name.log" |
    awk '{ s += $1; n++ } END { if (n) printf "%.1f", s / n; else printf "-" }')
  peak_max=0
  for ((r = 0; r < nproc; r++)); do
    p=$(last_of "$out/$name/metrics_rank_$r.jsonl" memory_gib)
    peak_max=$(awk -v a="$peak_max" -v b="$p" 'BEGIN { print (b > a ? b : a) }')
  done
  rows+=("$ep|$(printf '%.1f' "$tps")|$(awk -v t="$tps" -v n="$nproc" 'BEGIN { printf "%.1f", t * n }')")
  rows[-1]+="|$(printf '%.2f' "$mfu")|$(awk -v a="$tps" -v b="$ref" 'BEGIN { printf "%.2f", a / b }')"
  rows[-1]+="|$comm|$(printf '%.2f' "$peak_max")|$(cpu_use "$name")"
  echo "#   done: ep $ep ($(cut -d' ' -f1 "$out/$name.time") s)" >&2
  # "memory per rank: parameters 17.01 MiB + gradients ..." of the FSDP start-up, for scale
  grep -m1 'memory per rank: parameters' "$out/$name.log" |
    sed -E 's/.*memory per rank: ([^(]*) \(.*/#   ep '"$ep"' per rank: \1/' || true
done

echo "# qwen3 debugmodel_moe, bf16, no AC, forced even routing, seq $seq, local batch" \
  "$local_batch x $nproc ranks (FSDP 2), 1 thread per rank; $steps steps, tokens/s over the last" \
  "$((steps - 1)); load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
fmt='%3s %10s %10s %6s %6s %6s %9s %5s %6s %6s\n'
printf "$fmt" ep 'tok/s/dev' 'tok/s job' 'MFU%' vs_ep1 'comm%' 'peak GiB' cpu cores others
for row in "${rows[@]}"; do
  IFS='|' read -r ep tps job mfu ratio comm peak use <<< "$row"
  read -r cpu cores others <<< "$use"
  printf "$fmt" "$ep" "$tps" "$job" "$mfu" "$ratio" "$comm" "$peak" "$cpu" "$cores" "$others"
done
