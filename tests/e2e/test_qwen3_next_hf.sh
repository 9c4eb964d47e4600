#!/usr/bin/env bash
# Qwen3-Next end to end, with transformers' Qwen3NextForCausalLM as the reference
# (tests/e2e/qwen3_next_transformers_reference.py, run by $TITAN_PYTHON).
# (A) HF -> ours: a random tiny-sized folder saved by transformers (unit-scale weights, spread
#     decays) converts to flavor tiny, its logits match transformers' within 1e-4, and it exports
#     back to the very same tensors; `titan generate` (with and without the cache: the linear
#     layers' carried state) gives transformers' greedy ids.
# (B) training (block-causal documents): 6 steps with falling loss; resuming from step 3
#     reproduces steps 4-6; the step-3 checkpoint exports to a folder transformers loads with
#     every weight used, with our logits.
# (C) FSDP 2, TP 2 (the linear-attention layers replicated over whole sequences), EP 2, PP 2
#     (1F1B) and full activation checkpointing reproduce the one-process losses within 1e-5
#     relative; context parallelism is refused with the reason; `titan inspect` sizes 80B-A3B.
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh)\" bash $0 $TITAN"
REF="$(dirname "$0")/qwen3_next_transformers_reference.py"
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
IDS="1 17 100 42 99 3 120 7 64 5 125 31 18 77 2 129 45 11 90 101 66 8 13 0 199"
PROMPT="1 17 100 42"

# ---- A: a folder saved by transformers --------------------------------------------------------
expect_exit 0 "$PY" "$REF" save-random "$WORK/hf_tiny" --seed 1
expect_exit 0 "$TITAN" convert from-hf "$WORK/hf_tiny" "$WORK/ck_tiny"
grep -q '"flavor": *"tiny"' "$WORK/ck_tiny/index.json" || fail "the folder is not flavor tiny"
expect_exit 0 "$TITAN" convert logits "$WORK/hf_tiny" --ids "$IDS" --out "$WORK/logits_tiny.st"
expect_exit 0 "$TITAN" convert to-hf "$WORK/ck_tiny" "$WORK/back_tiny"
for cache in "" --no_kv_cache; do
  # shellcheck disable=SC2086  # one option or none
  expect_exit 0 "$TITAN" generate --checkpoint "$WORK/hf_tiny" --prompt_ids "$PROMPT" \
    --temperature 0 --max_new_tokens 10 --print_ids $cache
  grep -E "^[0-9 ]+$" "$WORK/out" >"$WORK/gen$cache"
done
cmp -s "$WORK/gen" "$WORK/gen--no_kv_cache" || fail "greedy ids differ with and without the cache"

# ---- B: training, resume, export ----------------------------------------------------------------
run=(--job.config_file configs/llama3/debug_model.toml --model.name qwen3_next
  --model.flavor tiny --model.hf_assets_path "" --model.attn_mask_type block_causal
  --training.seq_len 32 --training.mixed_precision_param float32 --training.steps 6
  --lr_scheduler.warmup_steps 1 --optimizer.lr 3e-3 --validation.enable false
  --metrics.log_freq 1 --metrics.peak_flops 1e12 --metrics.disable_color_printing)
values() { grep '"loss":' "$WORK/$1/metrics.jsonl" | sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/'; }
same() {  # same NAME REF [FROM]: NAME's losses equal REF's (from line FROM) within 1e-5 relative
  paste -d' ' <(values "$2" | tail -n +"${3:-1}") <(values "$1") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d / $1 > 1e-5 || NF != 2) bad = 1; n++ }
         END { exit bad || n == 0 }' ||
    fail "$1: losses $(values "$1" | tr '\n' ' ') vs $2's $(values "$2" | tr '\n' ' ')"
}
expect_exit 0 "$TITAN" train "${run[@]}" --training.local_batch_size 4 --job.dump_folder "$WORK/one" \
  --checkpoint.enable --checkpoint.interval 3 --checkpoint.last_save_model_only false
awk -v a="$(values one | head -n 1)" -v b="$(values one | tail -n 1)" 'BEGIN { exit !(b < a - 0.1) }' ||
  fail "the loss does not fall: $(values one | tr '\n' ' ')"
mkdir -p "$WORK/resume/checkpoint"
cp -r "$WORK/one/checkpoint/step-3" "$WORK/resume/checkpoint/"
expect_exit 0 "$TITAN" train "${run[@]}" --training.local_batch_size 4 \
  --job.dump_folder "$WORK/resume" --checkpoint.enable --checkpoint.interval 3
expect_output "resuming training after step 3"
same resume one 4
expect_exit 0 "$TITAN" convert logits "$WORK/one/checkpoint/step-3" --ids "$IDS" \
  --out "$WORK/logits_ours.st"
expect_exit 0 "$TITAN" convert to-hf "$WORK/one/checkpoint/step-3" "$WORK/hf_ours"
grep -q '"model_type": "qwen3_next"' "$WORK/hf_ours/config.json" || fail "model_type"

expect_exit 0 "$PY" "$REF" check-logits "$WORK/hf_tiny" "$WORK/logits_tiny.st" --ids "$IDS" + \
  same-tensors "$WORK/hf_tiny" "$WORK/back_tiny" + \
  check-greedy "$WORK/hf_tiny" --ids "$PROMPT" --expect "$(cat "$WORK/gen")" --new 10 + \
  check-logits "$WORK/hf_ours" "$WORK/logits_ours.st" --ids "$IDS"
grep -E "^(ok|FAIL)" "$WORK/out"

# ---- C: parallelisms, sizes ---------------------------------------------------------------------
for layout in "fsdp --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2" \
  "tp --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4" \
  "ep --parallelism.expert_parallel_degree 2 --training.local_batch_size 2" \
  "pp --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B
    --training.local_batch_size 4"; do
  read -r -d '' name opts <<<"$layout" || true
  # shellcheck disable=SC2086  # the options split into words
  expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- train "${run[@]}" \
    --job.dump_folder "$WORK/$name" $opts
  same "$name" one
done
expect_exit 0 "$TITAN" train "${run[@]}" --training.local_batch_size 4 \
  --job.dump_folder "$WORK/ac" --activation_checkpoint.mode full
same ac one
expect_exit 2 timeout 120 "$TITAN" run --nproc_per_node 2 -- train "${run[@]}" \
  --training.local_batch_size 4 --job.dump_folder "$WORK/cp" --parallelism.context_parallel_degree 2
expect_output "context parallelism would pass the linear-attention layers' recurrent state"
expect_exit 0 "$TITAN" inspect --model.name qwen3_next --model.flavor 80B-A3B
expect_output "79,674,391,296 total, .* 3,874,929,408 active per token"
echo "PASS test_qwen3_next_hf"
