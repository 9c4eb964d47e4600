#!/usr/bin/env bash
# Parallelism benchmark: the same global batch trained by 1 process x 2 threads and by
# 2 processes x 1 thread (FSDP, DDP, TP) on this machine's cores, float32 and bfloat16, model (a) of
# run_bench.sh (flavor bench_small: dim 256, 6 layers, vocab 8192; seq 256, global batch 8) on
# the sotu corpus. Prints job tokens/s (all ranks), the ratio to 1 process, MFU per rank, the time
# per step each rank spent blocked in collectives (communication not hidden behind compute) and
# the peak memory of rank 0. A benchmark, not a test: it never fails on speed.
#   bench/parallel_bench.sh [STEPS]
#   MODEL=flux bench/parallel_bench.sh [STEPS]   # FLUX's debugmodel (FLAVOR=...: another), 64 px
#                                                # shapes, 8 images a step; tokens are image tokens
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
steps="${1:-20}"
titan="$root/build/titan"
[ -x "$titan" ] || bash "$root/scripts/setup.sh"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

common=(--job.config_file configs/llama3/debug_model.toml --model.flavor bench_small
  --training.seq_len 256 --training.global_batch_size 8 --training.steps "$steps"
  --validation.enable false --checkpoint.enable false --metrics.log_freq 1
  --lr_scheduler.warmup_steps 2)
if [ "${MODEL:-llama3}" = flux ]; then
  common=(--job.config_file configs/flux/debug_model.toml --model.flavor "${FLAVOR:-debugmodel}"
    --training.global_batch_size 8 --training.steps "$steps" --validation.enable false
    --checkpoint.enable false --metrics.log_freq 1 --lr_scheduler.warmup_steps 2)
fi

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # mean_of, last_of

printf '%-9s %-22s %10s %7s %8s %14s %9s\n' dtype layout 'tok/s' ratio mfu 'comm_ms/step' 'GiB/rank'
for dtype in float32 bfloat16; do
  base=""
  for layout in single fsdp ddp tp; do
    dir="$out/$dtype-$layout"
    case $layout in
      single) cmd=("$titan" train --training.num_threads 2 --training.local_batch_size 8); ranks=1 ;;
      fsdp) cmd=("$titan" run --nproc_per_node 2 -- train --training.num_threads 1
                 --training.local_batch_size 4); ranks=2 ;;
      ddp) cmd=("$titan" run --nproc_per_node 2 -- train --training.num_threads 1
                --training.local_batch_size 4 --parallelism.data_parallel_replicate_degree 2
                --parallelism.data_parallel_shard_degree 1); ranks=2 ;;
      # tensor parallel: both ranks train the same 8 sequences; each counts half their tokens
      tp) cmd=("$titan" run --nproc_per_node 2 -- train --training.num_threads 1
               --training.local_batch_size 8 --parallelism.tensor_parallel_degree 2); ranks=2 ;;
    esac
    "${cmd[@]}" "${common[@]}" --training.mixed_precision_param $dtype --job.dump_folder "$dir" \
      >"$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
    tps=$(awk -v t="$(mean_of "$dir/metrics.jsonl" tps 2)" -v r=$ranks 'BEGIN { printf "%.1f", t * r }')
    [ -n "$base" ] || base=$tps
    comm=$(sed -nE 's/.*blocked in collectives ([0-9.eE+-]+) ms per step.*/\1/p' "$dir.log" | head -n 1)
    printf '%-9s %-22s %10s %7.2f %7.2f%% %14s %9s\n' $dtype \
      "$([ $layout = single ] && echo '1 proc x 2 threads' || echo "2 procs x 1 thread $layout")" \
      "$tps" "$(awk -v a="$tps" -v b="$base" 'BEGIN { print a / b }')" \
      "$(mean_of "$dir/metrics.jsonl" mfu 2)" "${comm:--}" "$(mean_of "$dir/metrics.jsonl" memory_gib 2)"
  done
done
