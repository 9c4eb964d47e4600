#!/usr/bin/env bash
# gpt-oss end to end, with transformers itself as the reference
# (tests/e2e/gpt_oss_transformers_reference.py, run by $TITAN_PYTHON).
# (A) HF -> ours: random GptOssForCausalLM folders saved by save_pretrained (unit-scale weights,
# biases and sinks around 1): the tiny flavor's sizes (YaRN x32 not truncated, windows of 8 in the
# even layers), and one of 4 layers with 8 heads of 8, windows of 5, 8 experts top-4 and plain
# RoPE. Each converts to our checkpoint (the first to flavor "tiny"), loads directly too with the
# same logits, matches transformers' logits within 1e-4 in float32 over 25 positions (three
# windows), and exports back to the very same tensors.
# (B) Training: tiny's loss falls over 6 steps; FSDP 2, TP 2 (sinks and q/k/v biases split with
# the heads), EP 2 (expert biases sliced with the experts), experts split over TP 2 (b1/b3 by
# hidden rows, b2 added on the first tp rank), PP 2 and CP 2 (ring attention with sinks and
# windows), and per-op activation checkpointing reproduce the one-process losses within 1e-5
# relative; a resumed run repeats them.
# (C) The trained checkpoint exports as a folder transformers loads with every weight used, whose
# logits equal ours within 1e-4; `titan generate` with and without the KV cache gives
# transformers' greedy ids past the window (the trained folder and the saved one).
# LoRA from the saved tiny folder on q_proj, v_proj and the routed experts: the PEFT export
# gives peft's logits (experts as target_parameters, gate and up interleaved in gate_up_proj's B
# as in the base parameter), the merged export transformers' logits, and the base folder plus
# the adapter imports to the trained model bit for bit.
# (D) `titan inspect` prints 20b's and 120b's total and active parameters (OpenAI's model card:
# 20.91B / 3.61B and 116.83B / 5.13B active without the embedding), for the configs/gpt_oss files.
source "$(dirname "$0")/parallel_lib.sh"
source "$(dirname "$0")/hf_family_lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh --print)\" bash $0 $TITAN"
REF="$(dirname "$0")/gpt_oss_transformers_reference.py"
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

IDS="1 17 100 42 99 3 120 7 64 5 125 31 18 77 2 129 45 11 90 101 66 8 13 0 199"  # vocab >= 200
PROMPT="1 17 100 42"

# ---- A: folders saved by transformers -> ours -> HF --------------------------------------------
declare -A CASES=(
  [tiny]="--seed 1"
  [wide]="--seed 2 --layers 4 --heads 8 --kv-heads 2 --head-dim 8 --window 5 --experts 8
    --top-k 4 --intermediate 48 --yarn 0"
)
hf_save_cases CASES
hf_folders_round_trip "${!CASES[@]}"
grep -q '"flavor": *"tiny"' "$WORK/ck_tiny/index.json" ||
  fail "the tiny-sized gpt-oss folder did not convert to the tiny flavor"

# ---- B: training and its parallel layouts ------------------------------------------------------
hf_tiny_layouts configs/gpt_oss/debug_model.toml

# ---- C: export of the trained model, generation ------------------------------------------------
hf_export_trained "$WORK/one/checkpoint/step-6" gpt_oss
hf_greedy 16 hf_ours hf_tiny hf_wide
# LoRA on the saved tiny folder: attention and the routed experts, as PEFT adapters.
hf_lora configs/gpt_oss/debug_model.toml "q_proj,v_proj,experts" \
  "on 4 linear layers and the routed experts of 2 MoE layers"
hf_run_checks

# ---- D: sizes ----------------------------------------------------------------------------------
expect_exit 0 "$TITAN" inspect --job.config_file configs/gpt_oss/gpt_oss_20b.toml
expect_output "20,914,757,184 total, 20,335,623,744 non-embedding, 4,187,440,704 active"
expect_exit 0 "$TITAN" inspect --job.config_file configs/gpt_oss/gpt_oss_120b.toml
expect_output "116,829,156,672 total, 116,250,023,232 non-embedding, 5,711,982,912 active"
echo "PASS test_gpt_oss_hf"
