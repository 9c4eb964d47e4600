#!/usr/bin/env bash
# `titan plan` against TorchTitan's published Llama 3.1 throughput on H100s
# (benchmarks/llama3_h100_202412_torchtitan.md in pytorch/torchtitan; the fact sheet's figures):
# each benchmark's layout written into a copy of our configs/llama3 TOML (local and global batch,
# degrees, activation checkpointing, schedule) and planned on its cluster with nothing held
# fixed, so the config's own layout is predicted and ranked among every layout the planner
# searches. Prints predicted vs reported tokens/s per GPU and memory, the errors, the planner's
# best layout and where TorchTitan's ranks. One compute efficiency for all (MFU, default 0.4;
# see docs/planning.md). A benchmark: it prints, it never fails on accuracy.
#   bench/plan_torchtitan.sh [MFU]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mfu="${1:-0.4}"
titan="$root/build/titan"
[ -x "$titan" ] || bash "$root/scripts/setup.sh"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# toml SRC LOCAL GLOBAL TP PP SCHEDULE AC: a copy of SRC with the benchmark's settings.
toml() {
  local src="$1" lb="$2" gb="$3" tp="$4" pp="$5" schedule="$6" ac="$7" mode option
  case "$ac" in full) mode=full; option=2 ;; *) mode=selective; option="$ac" ;; esac
  sed -E -e "s/^local_batch_size = .*/local_batch_size = $lb/" \
    -e "s/^global_batch_size = .*//" \
    -e "s/^tensor_parallel_degree = [0-9]+/tensor_parallel_degree = $tp/" \
    -e "s/^pipeline_parallel_degree = [0-9]+/pipeline_parallel_degree = $pp\npipeline_parallel_schedule = \"$schedule\"/" \
    -e "s/^mode = .*/mode = \"$mode\"/" -e "s/^selective_ac_option = .*/selective_ac_option = \"$option\"/" \
    -e "s/^\[training\]/[training]\nglobal_batch_size = $gb/" "$src"
}

# field FILE PATTERN: the first sed capture of PATTERN in FILE.
field() { sed -nE "s/$2/\1/p" "$1" | head -n 1; }

# name | config | nodes | local batch | global batch | tp | pp | schedule | AC | reported tok/s | GiB
cases=(
  "8B FSDP 8|llama3_8b|1|2|16|1|1|1F1B|op|5762|82.4"
  "70B FSDP 32 x TP 8|llama3_70b|32|16|512|8|1|1F1B|full|829|71.9"
  "405B FSDP 8 x TP 8 x PP 8, 1F1B|llama3_405b|64|32|256|8|8|1F1B|full|100|82.5"
  "405B FSDP 8 x TP 8 x PP 8, Interleaved1F1B|llama3_405b|64|32|256|8|8|Interleaved1F1B|full|128|72.7"
)
printf '%-44s %9s %9s %8s %9s %9s %8s  %s\n' case 'tok/s rep' 'tok/s pred' error 'GiB rep' \
  'GiB pred' 'rank' 'planner best (tok/s)'
for entry in "${cases[@]}"; do
  IFS='|' read -r name config nodes lb gb tp pp schedule ac tps gib <<<"$entry"
  toml "configs/llama3/$config.toml" "$lb" "$gb" "$tp" "$pp" "$schedule" "$ac" >"$out/job.toml"
  "$titan" plan --job.config_file "$out/job.toml" --gpu h100 --gpu_memory_gib 94 \
    --nodes "$nodes" --gpus_per_node 8 --mfu "$mfu" --top 1 \
    --pp_schedules 1F1B,Interleaved1F1B >"$out/plan"
  own=$(sed -n "/^the config's layout/,\$p" "$out/plan")
  echo "$own" >"$out/own"
  pred=$(field "$out/own" '^   tokens\/s per device ([0-9,]+),.*' | tr -d ,)
  pred_gib=$(field "$out/own" '^   memory per device ([0-9.]+) GiB.*')
  rank=$(field "$out/own" "^the config's layout, rank ([0-9]+ of [0-9]+).*")
  best=$(field "$out/plan" '^#1 (.*)')
  best_tps=$(field "$out/plan" '^   tokens\/s per device ([0-9,]+),.*')
  awk -v n="$name" -v r="$tps" -v p="$pred" -v rg="$gib" -v pg="$pred_gib" -v k="${rank:-n/a}" \
    -v b="$best ($best_tps)" 'BEGIN { printf "%-44s %9d %9d %+7.1f%% %9.1f %9.1f %8s  %s\n",
      n, r, p, 100 * (p / r - 1), rg, pg, k, b }'
done
