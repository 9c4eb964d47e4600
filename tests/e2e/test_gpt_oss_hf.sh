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
save=() checks=()
for c in "${!CASES[@]}"; do
  # shellcheck disable=SC2206  # the options split into words
  save+=(save-random "$WORK/hf_$c" ${CASES[$c]} +)
done
unset 'save[${#save[@]}-1]'  # the trailing "+"
"$PY" "$REF" "${save[@]}" || fail "transformers could not write the random folders"
for c in "${!CASES[@]}"; do
  hf="$WORK/hf_$c"
  expect_exit 0 "$TITAN" convert from-hf "$hf" "$WORK/ck_$c"
  expect_exit 0 "$TITAN" convert logits "$WORK/ck_$c" --ids "$IDS" --out "$WORK/logits_$c.st"
  expect_exit 0 "$TITAN" convert logits "$hf" --ids "$IDS" --out "$WORK/logits_${c}_hf.st"
  cmp "$WORK/logits_$c.st" "$WORK/logits_${c}_hf.st" ||
    fail "$c: logits from the HF folder and from its conversion differ"
  expect_exit 0 "$TITAN" convert to-hf "$WORK/ck_$c" "$WORK/back_$c"
  checks+=(check-logits "$hf" "$WORK/logits_$c.st" --ids "$IDS" + same-tensors "$hf" "$WORK/back_$c" +)
done
grep -q '"flavor": *"tiny"' "$WORK/ck_tiny/index.json" ||
  fail "the tiny-sized gpt-oss folder did not convert to the tiny flavor"

# ---- B: training and its parallel layouts ------------------------------------------------------
common=(--job.config_file configs/gpt_oss/debug_model.toml --model.flavor tiny
  --model.hf_assets_path "" --training.seq_len 32 --training.local_batch_size 4
  --training.global_batch_size 4 --training.steps 6 --training.mixed_precision_param float32
  --metrics.log_freq 1 --metrics.peak_flops 1e12 --metrics.disable_color_printing
  --lr_scheduler.warmup_steps 2 --optimizer.lr 1e-2 --validation.enable false
  --checkpoint.enable true --checkpoint.interval 3 --checkpoint.last_save_model_only false)
train one 1
first=$(json_field "$WORK/one/metrics.jsonl" loss 1)
last=$(json_field "$WORK/one/metrics.jsonl" loss 6)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1) }' || fail "loss did not fall: $first -> $last"
echo "one: loss $first -> $last over 6 steps"
train fsdp2 2 --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2
same_losses one fsdp2 loss
train tp2 2 --parallelism.tensor_parallel_degree 2
same_losses one tp2 loss
train ep2 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 2
same_losses one ep2 loss
train pp2 2 --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B \
  --parallelism.pipeline_parallel_microbatch_size 2
same_losses one pp2 loss
train cp2 2 --parallelism.context_parallel_degree 2
same_losses one cp2 loss
train op_ac 1 --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op
same_losses one op_ac loss
train etp2 2 --parallelism.tensor_parallel_degree 2 --parallelism.expert_tensor_parallel_degree 2
same_losses one etp2 loss
resume_from one 3 resumed 1

# ---- C: export of the trained model, generation ------------------------------------------------
ck="$WORK/one/checkpoint/step-6"
expect_exit 0 "$TITAN" convert logits "$ck" --ids "$IDS" --out "$WORK/logits_ours.st"
expect_exit 0 "$TITAN" convert to-hf "$ck" "$WORK/hf_ours"
grep -q '"model_type": "gpt_oss"' "$WORK/hf_ours/config.json" || fail "model_type not gpt_oss"
checks+=(check-logits "$WORK/hf_ours" "$WORK/logits_ours.st" --ids "$IDS" +)
for m in hf_ours hf_tiny hf_wide; do
  for cache in "" --no_kv_cache; do
    # shellcheck disable=SC2086  # $cache is one option or none
    "$TITAN" generate --checkpoint "$WORK/$m" --prompt_ids "$PROMPT" --temperature 0 \
      --max_new_tokens 16 --print_ids $cache >"$WORK/gen_$m$cache.out" 2>"$WORK/gen.err" ||
      { cat "$WORK/gen.err" >&2; fail "generate $m $cache failed"; }
  done
  cmp -s "$WORK/gen_$m.out" "$WORK/gen_$m--no_kv_cache.out" ||
    fail "$m: greedy ids differ with and without the KV cache"
  checks+=(check-greedy "$WORK/$m" --ids "$PROMPT" --expect "$(cat "$WORK/gen_$m.out")" --new 16 +)
done

# ---- LoRA on the saved tiny folder: attention and the routed experts, as PEFT adapters --------
"$PY" "$REF" token-file "$WORK/tokens.bin" --vocab-size 258 --tokens 130 >/dev/null ||
  fail "could not write the token file"
lora=(--job.config_file configs/gpt_oss/debug_model.toml --model.flavor tiny
  --model.hf_assets_path "" --checkpoint.initial_load_path "$WORK/hf_tiny"
  --checkpoint.initial_load_in_hf true --training.dataset tokens
  --training.dataset_path "$WORK/tokens.bin" --training.dataset_shuffle false
  --training.seq_len 32 --training.local_batch_size 4 --training.steps 6
  --training.mixed_precision_param float32 --metrics.log_freq 1 --lr_scheduler.warmup_steps 2
  --optimizer.lr 1e-2 --validation.enable false --checkpoint.enable true
  --checkpoint.interval 6 --checkpoint.last_save_model_only true --model.converters lora
  --lora.rank 4 --lora.alpha 8 --lora.target_modules "q_proj,v_proj,experts"
  --job.dump_folder "$WORK/lora")
expect_exit 0 "$TITAN" train "${lora[@]}"
expect_output "on 4 linear layers and the routed experts of 2 MoE layers"
lck="$WORK/lora/checkpoint/step-6"
expect_exit 0 "$TITAN" convert logits "$lck" --ids "$IDS" --out "$WORK/logits_lora.st"
expect_exit 0 "$TITAN" convert to-peft "$lck" "$WORK/peft"
expect_exit 0 "$TITAN" convert to-hf "$lck" "$WORK/merged" --merge-lora
checks+=(check-peft "$WORK/hf_tiny" "$WORK/peft" "$WORK/logits_lora.st" --ids "$IDS" +
  check-logits "$WORK/merged" "$WORK/logits_lora.st" --ids "$IDS" +)
expect_exit 0 "$TITAN" convert from-hf "$WORK/hf_tiny" "$WORK/imported" --adapter "$WORK/peft"
expect_exit 0 "$TITAN" convert logits "$WORK/imported" --ids "$IDS" --out "$WORK/logits_imp.st"
cmp "$WORK/logits_lora.st" "$WORK/logits_imp.st" ||
  fail "the imported PEFT adapter does not give the trained model's logits"

# All transformers checks in one process (importing transformers takes seconds).
unset 'checks[${#checks[@]}-1]'  # the trailing "+"
"$PY" "$REF" "${checks[@]}" || fail "transformers disagrees (see the FAIL lines above)"

# ---- D: sizes ----------------------------------------------------------------------------------
expect_exit 0 "$TITAN" inspect --job.config_file configs/gpt_oss/gpt_oss_20b.toml
expect_output "20,914,757,184 total, 20,335,623,744 non-embedding, 4,187,440,704 active"
expect_exit 0 "$TITAN" inspect --job.config_file configs/gpt_oss/gpt_oss_120b.toml
expect_output "116,829,156,672 total, 116,250,023,232 non-embedding, 5,711,982,912 active"
echo "PASS test_gpt_oss_hf"
