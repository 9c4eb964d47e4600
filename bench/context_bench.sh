#!/usr/bin/env bash
# Context-parallelism benchmark: one long sequence per step (global batch 1) of model (a) of
# run_bench.sh (flavor bench_small: dim 256, 6 layers, vocab 8192) on the sotu corpus, float32,
# no activation checkpointing (so that the activations the sequence split shrinks are all kept),
# one thread per rank, validation and checkpoints off. For each seq in SEQS (default 8192 16384):
# one process without CP (cp 1), then cp 2 and cp 4 (cp processes x 1 thread; FSDP shards the
# parameters over the cp ranks) with each rotate method, allgather and alltoall, head-tail load
# balancing on. Per run it prints:
#   tok/s job   tokens of the whole job per second (each rank's metrics count its seq/cp tokens:
#               rank 0's mean over the steps after the first, times cp)
#   tok/s/dev   the same per rank (per device), and the job's ratio to cp 1 at that seq
#   comm%       the share of the step each rank was blocked in FSDP's collectives (the trainer's
#               "blocked in collectives", mean over ranks; ring attention's own K/V transfers are
#               not counted in it)
#   peak GiB    the largest peak RSS of the ranks (metrics' memory_gib, the run's high-water mark)
#   act GiB     peak activation memory per rank: each rank's peak RSS minus its peak RSS in a
#               baseline run of the same layout at seq 64 (same process, libtorch, Gloo buffers,
#               parameters, gradients and AdamW states, whose activations are negligible); the
#               largest over ranks. The RSS before the first step is not logged, and it would
#               miss the gradients and AdamW states the first step allocates.
#   est GiB     `titan inspect`'s activation estimate for the whole sequence, over cp (inspect
#               itself does not divide it by cp)
#   cpu         this job's CPU seconds (all ranks, start-up included) over wall seconds x ranks:
#               cp 4 on 2 cores cannot exceed 0.5; a rank blocked in a collective sleeps
#   cores       this job's cores in use on average (CPU seconds / wall seconds), and "+N" the
#               cores other work on the machine kept busy meanwhile (from /proc/stat); a large
#               "+N" means the figures of that row are skewed by contention
# and, per layout, the parameter + gradient + AdamW bytes per rank, for scale. A benchmark, not a
# test: it never fails on speed.
#   bench/context_bench.sh [path/to/titan] [STEPS]      STEPS defaults to 5 (the first is warm-up)
#   SEQS="1024" bench/context_bench.sh build/titan 3    a quick check of the script
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
titan="${1:-build/titan}"
steps="${2:-5}"
seqs=(${SEQS:-8192 16384})
[ -x "$titan" ] || { echo "error: $titan not found; build it (scripts/setup.sh)" >&2; exit 1; }
[ "$steps" -ge 2 ] 2>/dev/null || { echo "error: STEPS must be >= 2 (1 is warm-up)" >&2; exit 1; }
for seq in "${seqs[@]}"; do
  (( seq % 8 == 0 )) || { echo "error: seq $seq must divide by 2 x cp = 8" >&2; exit 1; }
done
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

base_seq=64
common=(--job.config_file configs/llama3/debug_model.toml --model.flavor bench_small
  --training.local_batch_size 1 --training.num_threads 1
  --training.mixed_precision_param float32 --activation_checkpoint.mode none
  --validation.enable false --checkpoint.enable false
  --metrics.log_freq 1 --metrics.save_for_all_ranks true --metrics.disable_color_printing true
  --lr_scheduler.warmup_steps 1)
# "cp|rotate": cp 1 is one process without CP
layouts=("1|-" "2|allgather" "2|alltoall" "4|allgather" "4|alltoall")

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # mean_of, last_of
# busy and total jiffies of the whole machine ("cpu" line of /proc/stat; idle and iowait are idle)
machine_jiffies() {
  awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' \
    /proc/stat
}

# train NAME CP ROTATE SEQ STEPS: one run into $out/NAME; on failure shows its log and stops.
train() {
  local name="$1" cp="$2" rotate="$3" seq="$4" n="$5"
  local cmd=("$titan" train)
  local args=(--training.seq_len "$seq" --training.steps "$n")
  if [ "$cp" != 1 ]; then
    cmd=("$titan" run --nproc_per_node "$cp" -- train)
    args+=(--parallelism.context_parallel_degree "$cp"
      --parallelism.context_parallel_rotate_method "$rotate"
      --parallelism.context_parallel_load_balancer headtail)
  fi
  local TIMEFORMAT='%R %U %S'  # wall, user and system seconds of the run and all its ranks
  local before; before=$(machine_jiffies)
  if ! { time LOG_RANK=all "${cmd[@]}" "${common[@]}" "${args[@]}" \
      --job.dump_folder "$out/$name" >"$out/$name.log" 2>&1; } 2>"$out/$name.time"; then
    echo "error: $name failed: ${cmd[*]} ... ${args[*]}" >&2; tail -n 30 "$out/$name.log" >&2
    exit 1
  fi
  echo "$before $(machine_jiffies)" >"$out/$name.jiffies"
  for ((r = 0; r < cp; r++)); do
    [ -s "$out/$name/metrics_rank_$r.jsonl" ] ||
      { echo "error: $name: rank $r wrote no metrics" >&2; tail -n 30 "$out/$name.log" >&2
        exit 1; }
  done
}

# peak RSS (GiB) of rank R of run NAME
peak() { last_of "$out/$1/metrics_rank_$2.jsonl" memory_gib; }
# "cpu cores +others" of run NAME over RANKS ranks
cpu_use() {
  local b0 t0 b1 t1
  read -r b0 t0 b1 t1 <"$out/$1.jiffies"
  awk -v r="$2" -v mb=$((b1 - b0)) -v cores="$(nproc)" -v mt=$((t1 - t0)) \
    '{ own = ($2 + $3) / $1; busy = mt > 0 ? cores * mb / mt : 0; other = busy - own
       printf "%.2f %.2f +%.2f", ($2 + $3) / ($1 * r), own, (other > 0 ? other : 0) }' \
    "$out/$1.time"
}
# activation estimate (GiB) of `titan inspect` for one sequence of SEQ tokens without CP
estimate() {
  "$titan" inspect "${common[@]}" --training.seq_len "$1" |
    sed -nE 's/^ *activations \(estimate\) +([0-9.]+) GiB.*/\1/p' | grep .
}

echo "# $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
echo "# baselines at seq $base_seq (3 steps) for the activation memory"
declare -A base state
for layout in "${layouts[@]}"; do
  IFS='|' read -r cp rotate <<< "$layout"
  name="base-$cp-$rotate"
  train "$name" "$cp" "$rotate" $base_seq 3
  m=""
  for ((r = 0; r < cp; r++)); do m+="${m:+/}$(printf '%.2f' "$(peak "$name" $r)")"; done
  base[$layout]="$name"
  # "memory per rank: parameters 17.01 MiB + gradients 17.01 MiB + AdamW states 34.01 MiB ..."
  line=$(grep -m1 'memory per rank: parameters' "$out/$name.log" |
    sed -E 's/.*memory per rank: (.*MiB) \(.*/\1/' || true)
  if [ -z "$line" ]; then  # one process: no FSDP line; fp32 weights, gradients, 2 AdamW moments
    params=$(sed -nE 's/.*model parameters: ([0-9,]+) .*/\1/p' "$out/$name.log" | head -n 1 |
      tr -d ,)
    line=$(awk -v n="$params" 'BEGIN { m = 4 * n / 1048576
      printf "parameters %.2f MiB + gradients %.2f MiB + AdamW states %.2f MiB", m, m, 2 * m }')
  fi
  state[$layout]="$line"
  printf '#   cp %s %-9s baseline peak RSS %s GiB; %s\n' "$cp" "$rotate" "$m" "$line"
done

rows=()  # "seq|cp|rotate|tps_job|tps_dev|ratio|comm|peak|act|est|cpu cores others"
for seq in "${seqs[@]}"; do
  est=$(estimate "$seq")
  ref=""
  for layout in "${layouts[@]}"; do
    IFS='|' read -r cp rotate <<< "$layout"
    name="$seq-$cp-$rotate"
    train "$name" "$cp" "$rotate" "$seq" "$steps"
    tps=$(mean_of "$out/$name/metrics_rank_0.jsonl" tps)
    job=$(awk -v t="$tps" -v c="$cp" 'BEGIN { printf "%.1f", t * c }')
    [ -n "$ref" ] || ref=$job
    # "[rank 1] ... parallelism: blocked in collectives 43.8 ms per step (5.65% of the step time)"
    comm=$(sed -nE \
      's/.*blocked in collectives [0-9.eE+-]+ ms per step \(([0-9.eE+-]+)% .*/\1/p' \
      "$out/$name.log" |
      awk '{ s += $1; n++ } END { if (n) printf "%.1f", s / n; else printf "-" }')
    peak_max=0 act_max=0
    for ((r = 0; r < cp; r++)); do
      p=$(peak "$name" $r)
      a=$(awk -v p="$p" -v b="$(peak "${base[$layout]}" $r)" 'BEGIN { print p - b }')
      peak_max=$(awk -v a="$peak_max" -v b="$p" 'BEGIN { print (b > a ? b : a) }')
      act_max=$(awk -v a="$act_max" -v b="$a" 'BEGIN { print (b > a ? b : a) }')
    done
    ratio=$(awk -v a="$job" -v b="$ref" 'BEGIN { printf "%.2f", a / b }')
    est_cp=$(awk -v e="$est" -v c="$cp" 'BEGIN { printf "%.2f", e / c }')
    rows+=("$seq|$cp|$rotate|$job|$tps|$ratio|$comm|$(printf '%.2f' "$peak_max")")
    rows[-1]+="|$(printf '%.2f' "$act_max")|$est_cp|$(cpu_use "$name" "$cp")"
    echo "#   done: seq $seq cp $cp $rotate ($(cut -d' ' -f1 "$out/$name.time") s)" >&2
  done
done

echo "# bench_small, float32, no AC, global batch 1; $steps steps, tokens/s over the last" \
  "$((steps - 1)); 1 thread per rank; load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
fmt='%6s %3s %-10s %10s %10s %6s %6s %9s %8s %8s %5s %6s %6s\n'
printf "$fmt" seq cp rotate 'tok/s job' 'tok/s/dev' vs_cp1 'comm%' 'peak GiB' 'act GiB' \
  'est GiB' cpu cores others
for row in "${rows[@]}"; do
  IFS='|' read -r seq cp rotate job tps ratio comm peak act est use <<< "$row"
  read -r cpu cores others <<< "$use"
  printf "$fmt" "$seq" "$cp" "$rotate" "$job" "$(printf '%.1f' "$tps")" "$ratio" "$comm" \
    "$peak" "$act" "$est" "$cpu" "$cores" "$others"
done
