#!/usr/bin/env bash
# Optimizers through the real binary: AdamW against Muon (optimizer.name = "Muon": the weight
# matrices orthogonalized, AdamW for the embedding, norms and head) on the same data, seed and
# steps, one process and FSDP 2 (where Muon's matrices travel to their owners and back). Per
# model and variant it prints:
#   loss        the mean training loss over the last 10 logged steps, and the first step's
#   vs_adamw    that loss minus AdamW's (negative: Muon is ahead)
#   tok/s       tokens per second (per rank), mean over the steps after the first 2 (warm-up)
#   ratio       tok/s over AdamW's in the same layout
#   MFU%        the trainer's MFU
#   peak GiB    the run's peak RSS (metrics' memory_gib, largest rank)
# Models: debugmodel (dim 256, 6 layers; seq 256 x 8) and debugmodel_narrow (dim 128). float32
# parameters, bf16 compute where the CPU has fast bf16 GEMMs (the trainer's choice, as always).
# A benchmark, not a test: it never fails on speed or loss.
#   bench/optimizer_bench.sh [path/to/titan] [STEPS]    STEPS defaults to 100
#   MODELS=debugmodel_narrow bench/optimizer_bench.sh build/titan 20    a quick check
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
titan="${1:-build/titan}"
steps="${2:-100}"
models=(${MODELS:-debugmodel debugmodel_narrow})
adamw_lr="${ADAMW_LR:-2e-3}"
muon_lr="${MUON_LR:-0.02}"
[ -x "$titan" ] || { echo "error: $titan not found; build it (scripts/setup.sh)" >&2; exit 1; }
[ "$steps" -ge 12 ] 2>/dev/null || { echo "error: STEPS must be >= 12" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # mean_of, last_of

declare -A variants=(
  [adamw]="--optimizer.name AdamW --optimizer.lr $adamw_lr"
  [muon]="--optimizer.name Muon --optimizer.lr $muon_lr --optimizer.muon_adamw_lr $adamw_lr"
)
printf "%-18s %-6s %-6s %10s %8s %9s %10s %6s %6s %9s\n" model layout opt loss first vs_adamw \
  tok/s ratio MFU% "peak GiB"
for model in "${models[@]}"; do
  for layout in one fsdp2; do
    declare -A loss=() tps=()
    for opt in adamw muon; do
      dir="$out/$model-$layout-$opt"
      common=(--job.config_file configs/llama3/debug_model.toml --model.flavor "$model"
        --training.steps "$steps" --training.seq_len 256 --training.global_batch_size 8
        --training.mixed_precision_param float32 --lr_scheduler.warmup_steps 10
        --validation.enable false --checkpoint.enable false --metrics.log_freq 1
        --metrics.disable_color_printing true --debug.seed 7 --job.dump_folder "$dir")
      if [ "$layout" = one ]; then
        cmd=("$titan" train --training.local_batch_size 8)
      else
        cmd=("$titan" run --nproc_per_node 2 -- train --training.local_batch_size 4)
      fi
      # shellcheck disable=SC2086
      "${cmd[@]}" "${common[@]}" ${variants[$opt]} >"$dir.log" 2>&1 ||
        { tail -n 20 "$dir.log" >&2; echo "error: $model $layout $opt failed" >&2; exit 1; }
      m="$dir/metrics.jsonl"
      loss[$opt]=$(grep '"loss":' "$m" | tail -n 10 |
        sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/' | awk '{ s += $1; n++ } END { printf "%.4f", s / n }')
      first=$(grep '"loss":' "$m" | head -n 1 | sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/')
      tps[$opt]=$(mean_of "$m" tps 2)
      printf "%-18s %-6s %-6s %10s %8.4f %9s %10.0f %6.3f %6.2f %9s\n" "$model" "$layout" "$opt" \
        "${loss[$opt]}" "$first" \
        "$(awk -v a="${loss[$opt]}" -v b="${loss[adamw]}" 'BEGIN { printf "%+.4f", a - b }')" \
        "${tps[$opt]}" "$(awk -v a="${tps[$opt]}" -v b="${tps[adamw]}" 'BEGIN { print a / b }')" \
        "$(mean_of "$m" mfu 2)" "$(printf "%.3f" "$(last_of "$m" memory_gib)")"
    done
  done
done
