#!/usr/bin/env bash
# Llama 4 end to end, with transformers itself as the reference
# (tests/e2e/llama4_transformers_reference.py, run by $TITAN_PYTHON).
# (A) HF -> ours: random Llama4ForCausalLM folders saved by save_pretrained (unit-scale weights):
# the tiny flavor's sizes (dense and MoE layers alternating, chunks of 8, layer 3 NoPE with
# queries temperature-tuned from position 3 on, the L2 qk norm, Llama 4's RoPE scaling), and one
# of 4 MoE layers with 8 heads of 8, top-2 routing, chunks of 5, a temperature floor of 3, no qk
# norm and plain RoPE. Each converts to our checkpoint (the first to flavor "tiny"), loads
# directly too with the same logits, matches transformers' logits within 1e-4 in float32 over 25
# positions (five chunks), and exports back to the very same tensors. The tiny model saved inside
# a Llama4ForConditionalGeneration (with a vision tower) imports to the same logits.
# (B) Training: tiny's loss falls over 6 steps; FSDP 2, TP 2, EP 2, experts split over TP 2, PP 2,
# CP 2 (ring attention with chunks across the ranks' sequence chunks) and per-op activation
# checkpointing reproduce the one-process losses within 1e-5 relative; a resumed run repeats them.
# With block-causal documents (several per chunk), CP 2 and PP 2 reproduce one process too.
# (C) The trained checkpoint exports as a folder transformers loads with every weight used, whose
# logits equal ours within 1e-4; `titan generate` with and without the KV cache gives
# transformers' greedy ids past the chunks (the trained folder and the saved ones). LoRA from the
# saved tiny folder on q_proj, v_proj and the routed experts: the PEFT export gives peft's logits
# (the experts' adapters with A and B swapped, as PEFT reads Llama 4's (experts, in, out)
# parameters as (experts, out, in)), the merged export transformers', and the base folder plus
# the adapter imports to the trained model bit for bit.
# (D) `titan inspect` prints the released models' sizes for the configs/llama4 files.
source "$(dirname "$0")/parallel_lib.sh"
source "$(dirname "$0")/hf_family_lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh --print)\" bash $0 $TITAN"
REF="$(dirname "$0")/llama4_transformers_reference.py"
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

IDS="1 17 100 42 99 3 120 7 64 5 125 31 18 77 2 129 45 11 90 101 66 8 13 0 199"  # vocab >= 200
PROMPT="1 17 100 42"

# ---- A: folders saved by transformers -> ours -> HF --------------------------------------------
"$PY" "$REF" save-random "$WORK/hf_tiny" --seed 1 --conditional "$WORK/hf_whole" + \
  save-random "$WORK/hf_wide" --seed 2 --heads 8 --kv-heads 2 --head-dim 8 --experts 8 \
  --top-k 2 --moe-step 1 --chunk 5 --floor 3 --qk-norm 0 --rope-scaling 0 --intermediate 48 \
  --intermediate-mlp 96 || fail "transformers could not write the random folders"
hf_folders_round_trip tiny wide
grep -q '"flavor": *"tiny"' "$WORK/ck_tiny/index.json" ||
  fail "the tiny-sized Llama 4 folder did not convert to the tiny flavor"
expect_exit 0 "$TITAN" convert logits "$WORK/hf_whole" --ids "$IDS" --out "$WORK/logits_whole.st"
expect_output "tensors of the vision tower and its projector are not read"
cmp "$WORK/logits_tiny.st" "$WORK/logits_whole.st" ||
  fail "the text model of the Llama4ForConditionalGeneration folder gives other logits"

# ---- B: training and its parallel layouts ------------------------------------------------------
hf_tiny_layouts configs/llama4/debug_model.toml
# Block-causal documents (4 to 12 characters: several per window of 32, across the chunks of 8):
# CP 2 and PP 2 give one process's losses.
alphabet=abcdefghijklmnopqrstuvwxyz
for ((d = 0; d < 400; d++)); do
  printf '{"text": "%s %d"}\n' "${alphabet:$((d % 20)):$((2 + d % 7))}" "$d"
done >"$WORK/short.jsonl"
docs=(--model.attn_mask_type block_causal --training.dataset jsonl
  --training.dataset_path "$WORK/short.jsonl" --checkpoint.enable false)
train docs_one 1 "${docs[@]}"
grep -q 'attention: block-causal' "$WORK/docs_one.log" || fail "docs_one: not block-causal"
train docs_cp2 2 "${docs[@]}" --parallelism.context_parallel_degree 2
same_losses docs_one docs_cp2 loss
train docs_pp2 2 "${docs[@]}" --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule 1F1B --parallelism.pipeline_parallel_microbatch_size 2
same_losses docs_one docs_pp2 loss

# ---- C: export of the trained model, generation, LoRA ------------------------------------------
hf_export_trained "$WORK/one/checkpoint/step-6" llama4_text
hf_greedy 16 hf_ours hf_tiny hf_wide
hf_lora configs/llama4/debug_model.toml "q_proj,v_proj,experts" \
  "on 8 linear layers and the routed experts of 2 MoE layers"
hf_run_checks

# ---- D: sizes ----------------------------------------------------------------------------------
expect_exit 0 "$TITAN" inspect --job.config_file configs/llama4/llama4_17bx16e.toml
expect_output "107,769,861,120 total, 106,735,375,360 non-embedding, 17,172,894,720 active"
expect_exit 0 "$TITAN" inspect --job.config_file configs/llama4/llama4_17bx128e.toml
expect_output "400,711,848,960 total, 399,677,363,200 non-embedding, 17,184,691,200 active"
echo "PASS test_llama4_hf"
