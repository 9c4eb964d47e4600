#!/usr/bin/env bash
# The default run of every registered debug flavor on this CPU: README.md's first command's
# config (configs/llama3/debug_model.toml: bf16, seq 256 x batch 8, selective activation
# checkpointing, validation) with the model swapped in, for STEPS steps (default 30) and one
# validation of 20 batches at the end. Prints training tokens/s and MFU (against the trainer's
# GEMM probe, the figures of metrics.jsonl after step 1), validation tokens/s and its ratio to
# training's, and the run's wall seconds. A benchmark, not a test: it never fails on speed.
#
#   bench/debug_flavors.sh                 # every debug flavor, this CPU's own paths
#   EMULATE_AVX2=1 bench/debug_flavors.sh  # an AVX2 CPU's paths on an AVX-512 one (below)
#   FLAVORS="llama3:debugmodel" STEPS=300 bench/debug_flavors.sh   # the whole default job
#
# EMULATE_AVX2=1 takes, on a CPU with AVX-512, the code paths an AVX2-only CPU takes: ATen's AVX2
# kernels (ATEN_CPU_CAPABILITY=avx2), MKL's and oneDNN's AVX2 code (MKL_ENABLE_INSTRUCTIONS,
# ONEDNN_MAX_CPU_ISA) and titan's choices for a CPU without fast bf16 GEMMs
# (TITAN_CPU_FAST_BF16_MATMUL=0). titan's own kernels still run their AVX-512 clone, and the
# clock and caches are this CPU's, so MFU (against a probe taken under the same settings) is the
# comparable figure, not tokens/s.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
titan="$root/build/titan"
[ -x "$titan" ] || bash "$root/scripts/setup.sh"
py="$(bash "$root/scripts/python_env.sh")"
steps="${STEPS:-30}"
flavors=(${FLAVORS:-llama3:debugmodel qwen3:debugmodel qwen3:debugmodel_moe deepseek_v3:debugmodel})
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
env_vars=()
if [ "${EMULATE_AVX2:-0}" = 1 ]; then
  env_vars=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
    TITAN_CPU_FAST_BF16_MATMUL=0)
fi
cd "$root"
echo "# $steps steps + 1 validation of 20 batches, $(nproc) cores${env_vars:+; ${env_vars[*]}}"
printf '%-24s %10s %7s %10s %9s %7s\n' flavor train_tps mfu val_tps val/train wall_s
for entry in "${flavors[@]}"; do
  model="${entry%%:*}" flavor="${entry#*:}"
  dump="$work/$model-$flavor"
  start=$(date +%s.%N)
  if ! env "${env_vars[@]}" "$titan" train --job.config_file configs/llama3/debug_model.toml \
    --model.name "$model" --model.flavor "$flavor" --training.steps "$steps" \
    --validation.freq "$steps" --metrics.log_freq 5 --job.dump_folder "$dump" \
    --metrics.disable_color_printing >"$dump.log" 2>&1; then
    echo "error: $model $flavor failed:" >&2; tail -n 20 "$dump.log" >&2; exit 1
  fi
  wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.0f", e - s }')
  "$py" - "$dump/metrics.jsonl" "$model:$flavor" "$wall" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = [r for r in rows if "tps" in r and r["step"] > 1]
val = [r for r in rows if "validation_tokens" in r]
tps = sum(r["tps"] for r in train) / len(train)
mfu = sum(r["mfu"] for r in train) / len(train)
vtps = val[-1]["validation_tokens"] / val[-1]["validation_s"]
print("%-24s %10.0f %6.1f%% %10.0f %9.2f %7s" % (sys.argv[2], tps, mfu, vtps, vtps / tps,
                                                 sys.argv[3]))
EOF
done
