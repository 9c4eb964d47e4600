#!/usr/bin/env bash
# Qwen3 Hugging Face interop, end to end, with transformers itself as the reference
# (tests/e2e/qwen3_transformers_reference.py, run by $TITAN_PYTHON). (A) Random dense
# Qwen3ForCausalLM folders saved by save_pretrained (head_dim != hidden_size / heads, GQA, random
# q/k norm weights; untied float32 with the tiny flavor's sizes, tied bfloat16 of no flavor)
# convert to our checkpoints, load directly too, give transformers' logits, and export back to the
# very same tensors. (B) Qwen3-MoE, ours -> HF: a tiny_moe seed checkpoint (zero expert biases)
# exports as a Qwen3MoeForCausalLM folder (one tensor per expert) that transformers loads with
# every weight used and whose logits equal ours.
# Tolerances: logits max |titan - transformers| <= 1e-4 in float32; the MoE seed model at 1e-5,
# since with init-scale weights a swapped gate/up or router row moves its logits by only ~3e-4.
# (C) That Qwen3-MoE folder back to ours (config model_type "qwen3_moe"), converted and loaded
# directly: the same logits, bit for bit.
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh)\" bash $0 $TITAN"
REF="$(dirname "$0")/qwen3_transformers_reference.py"
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

IDS="1 17 100 42 99 3 120 7 64 5 125 31 18 77 2 129 45 11 90 101 66 8 13 0 199"  # vocab >= 200

# ---- A: dense folders saved by transformers -> ours -> HF ---------------------------------------
declare -A CASES=(
  [tiny_fp32]="--seed 1 --hidden 64 --heads 4 --kv-heads 2 --head-dim 32 --vocab 300
    --intermediate 128"
  [tied_bf16]="--seed 2 --hidden 96 --heads 8 --kv-heads 2 --head-dim 16 --vocab 200
    --intermediate 160 --rope-theta 10000 --tied --dtype bfloat16"
)
save=() checks=()
for c in "${!CASES[@]}"; do
  # shellcheck disable=SC2206  # the options split into words
  save+=(save-random "$WORK/hf_$c" ${CASES[$c]} +)
done
save+=(save-random "$WORK/hf_moe_probe" --experts 4)  # transformers' own MoE layout, read below
"$PY" "$REF" "${save[@]}" || fail "transformers could not write the random folders"
for c in "${!CASES[@]}"; do
  hf="$WORK/hf_$c"
  expect_exit 0 "$TITAN" convert from-hf "$hf" "$WORK/ck_$c"
  expect_exit 0 "$TITAN" convert logits "$WORK/ck_$c" --ids "$IDS" --out "$WORK/logits_$c.st"
  expect_exit 0 "$TITAN" convert logits "$hf" --ids "$IDS" --out "$WORK/logits_${c}_hf.st"
  cmp "$WORK/logits_$c.st" "$WORK/logits_${c}_hf.st" ||
    fail "$c: logits from the HF folder and from its conversion differ"
  dtype=float32
  [ "$c" = tied_bf16 ] && dtype=bfloat16
  expect_exit 0 "$TITAN" convert to-hf "$WORK/ck_$c" "$WORK/back_$c" --dtype "$dtype"
  checks+=(check-logits "$hf" "$WORK/logits_$c.st" --ids "$IDS" +
           same-tensors "$hf" "$WORK/back_$c" +)
done
grep -q '"flavor": *"tiny"' "$WORK/ck_tiny_fp32/index.json" ||
  fail "the tiny-sized Qwen3 folder did not convert to the tiny flavor"

# ---- B: Qwen3-MoE, ours -> HF -------------------------------------------------------------------
expect_exit 0 "$TITAN" train --job.config_file configs/llama3/debug_model.toml --model.name qwen3 \
  --model.flavor tiny_moe --model.hf_assets_path "" --job.dump_folder "$WORK/moe" \
  --checkpoint.enable true --checkpoint.create_seed_checkpoint true --training.seq_len 32 \
  --training.local_batch_size 1 --validation.enable false
ck="$WORK/moe/checkpoint/step-0"
expect_exit 0 "$TITAN" convert logits "$ck" --ids "$IDS" --out "$WORK/logits_moe.st"
expect_exit 0 "$TITAN" convert to-hf "$ck" "$WORK/hf_moe"
grep -q '"model_type": "qwen3_moe"' "$WORK/hf_moe/config.json" || fail "model_type not qwen3_moe"
checks+=(check-logits "$WORK/hf_moe" "$WORK/logits_moe.st" --ids "$IDS" --atol 1e-5 +
         same-names "$WORK/hf_moe" "$WORK/hf_moe_probe")

# ---- C: Qwen3-MoE, HF -> ours ------------------------------------------------------------------
expect_exit 0 "$TITAN" convert from-hf "$WORK/hf_moe" "$WORK/ck_moe_back"
expect_exit 0 "$TITAN" convert logits "$WORK/ck_moe_back" --ids "$IDS" --out "$WORK/logits_moe_back.st"
expect_exit 0 "$TITAN" convert logits "$WORK/hf_moe" --ids "$IDS" --out "$WORK/logits_moe_hf.st"
cmp "$WORK/logits_moe.st" "$WORK/logits_moe_back.st" ||
  fail "the MoE model converted back from HF gives other logits"
cmp "$WORK/logits_moe.st" "$WORK/logits_moe_hf.st" ||
  fail "the MoE HF folder loaded directly gives other logits"

# All transformers checks in one process (importing transformers takes seconds).
"$PY" "$REF" "${checks[@]}" || fail "transformers disagrees (see the FAIL lines above)"
echo "PASS test_qwen3_hf"
