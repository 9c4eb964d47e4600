#!/usr/bin/env bash
# Hugging Face interop, end to end, with transformers itself as the reference
# (tests/e2e/hf_transformers_reference.py, run by $TITAN_PYTHON, the project's Python from
# scripts/python_env.sh; ctest sets it). (A) Folders saved by transformers' save_pretrained from
# random small LlamaConfigs (GQA and not, llama3 and default RoPE, tied and untied embeddings,
# float32 and bfloat16) convert to our checkpoints, give transformers' logits, export back to
# the very same tensors and config, and one of them (the tiny flavor's sizes) trains on, with
# step 1's loss equal to transformers' loss on the same batch. (B) A debug model trained here with
# its own tokenizer and a checkpoint converts to HF (single file, sharded, bf16; tokenizer files
# and token ids included); transformers loads it and reproduces our logits; from-hf gives back
# bit-identical tensors; the trainer's checkpoint.last_save_in_hf export equals to-hf.
# Plus usage errors (exit 2) and a corrupt file (exit 1, named).
# Tolerances: logits max |titan - transformers| <= 1e-4, both in float32 (bfloat16 folders are
# compared with their weights cast to float32, exactly as titan reads them); step-1 loss relative
# difference <= 1e-5.
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh)\" bash $0 $TITAN"
"$PY" -c "import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ('torch', 'transformers', 'safetensors')))" ||
  fail "TITAN_PYTHON=$PY lacks torch, transformers or safetensors. HINT: use the project's \
environment, TITAN_PYTHON=\"\$(scripts/python_env.sh)\""
REF="$(dirname "$0")/hf_transformers_reference.py"
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# json_get FILE EXPR: a value of a JSON file, e.g. json_get config.json '["hidden_size"]'.
json_get() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))$2)" "$1"; }

# ---- usage errors: exit 2 ------------------------------------------------------------------------
expect_exit 2 "$TITAN" convert
expect_output "missing action"
expect_exit 2 "$TITAN" convert to-hf only_one
expect_output "takes CHECKPOINT OUT"
expect_exit 2 "$TITAN" convert to-hf a b --dtype int8
expect_output "--dtype must be float32, bfloat16 or float16"
expect_exit 2 "$TITAN" convert from-hf "$WORK/nope" "$WORK/out"
expect_output "is not a Hugging Face folder"
expect_exit 0 "$TITAN" convert --help
expect_output "usage: titan convert to-hf"

# ---- A: folders saved by transformers -> ours -> HF, and training on -----------------------------
IDS_A="1 17 100 42 99 3 120 7 64 5 125 31 18 77 2 129 45 11 90 101 66 8 13 0"  # vocab >= 130
# CASE: save-random options. "tiny" has the tiny flavor's sizes (RoPE: theta 5e5, llama3 scaling
# 8, 1, 4, 8192; rms eps 1e-5) so that `titan train --model.flavor tiny` can load it.
declare -A CASES=(
  [gqa_llama3_fp32]="--seed 3 --hidden 96 --heads 6 --kv-heads 2 --vocab 130 --llama3-rope 4 1 4 32"
  [mha_llama3_tied_bf16]="--seed 4 --hidden 128 --heads 4 --vocab 257 --intermediate 256 --tied
    --dtype bfloat16 --rope-theta 500000 --llama3-rope 8 1 4 64"
  [gqa_default_tied_fp32]="--seed 5 --hidden 64 --heads 4 --kv-heads 1 --vocab 200
    --intermediate 160 --tied --rope-theta 500000"
  [tiny]="--seed 6 --hidden 64 --heads 4 --kv-heads 2 --vocab 300 --intermediate 192 --norm-eps 1e-5
    --rope-theta 500000 --llama3-rope 8 1 4 8192 --max-positions 16384 --dtype bfloat16"
)
save=() checks=()
for c in "${!CASES[@]}"; do
  # shellcheck disable=SC2206  # the options split into words
  save+=(save-random "$WORK/hf_$c" ${CASES[$c]} +)
done
# One document of random byte ids for the training run (the byte tokenizer: vocab 258).
"$PY" "$REF" "${save[@]}" token-file "$WORK/tokens.bin" --vocab-size 258 --tokens 300 ||
  fail "transformers could not write the random folders"
for c in "${!CASES[@]}"; do
  hf="$WORK/hf_$c"
  expect_exit 0 "$TITAN" convert from-hf "$hf" "$WORK/ck_$c"
  expect_exit 0 "$TITAN" convert logits "$WORK/ck_$c" --ids "$IDS_A" \
    --out "$WORK/logits_$c.safetensors"
  # The HF folder also loads directly, with the very same logits.
  expect_exit 0 "$TITAN" convert logits "$hf" --ids "$IDS_A" \
    --out "$WORK/logits_${c}_hf.safetensors"
  cmp "$WORK/logits_$c.safetensors" "$WORK/logits_${c}_hf.safetensors" ||
    fail "$c: logits from the HF folder and from its conversion differ"
  dtype="$(json_get "$hf/config.json" '["dtype"]')"
  expect_exit 0 "$TITAN" convert to-hf "$WORK/ck_$c" "$WORK/back_$c" --dtype "$dtype"
  checks+=(check-logits "$hf" "$WORK/logits_$c.safetensors" --ids "$IDS_A" +
           same-tensors "$hf" "$WORK/back_$c" + same-config "$hf" "$WORK/back_$c" +)
done

# Training on from the converted checkpoint and from the HF folder itself: step 1 (before any
# update) has the same loss both ways, transformers' loss on that batch; all losses are finite.
train=(train --job.config_file configs/llama3/debug_model.toml --model.flavor tiny
       --model.hf_assets_path "" --training.dataset tokens
       --training.dataset_path "$WORK/tokens.bin"
       --training.dataset_shuffle false --training.seq_len 32 --training.local_batch_size 2
       --training.steps 3 --training.mixed_precision_param float32 --validation.enable false
       --metrics.log_freq 1 --lr_scheduler.warmup_steps 0)
expect_exit 0 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_ck" \
  --checkpoint.initial_load_path "$WORK/ck_tiny"
expect_output "loaded checkpoint .*ck_tiny"
expect_exit 0 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_hf" \
  --checkpoint.initial_load_path "$WORK/hf_tiny" --checkpoint.initial_load_in_hf true
expect_output "loaded the model from the Hugging Face folder"
for run in run_ck run_hf; do
  for step in 1 2 3; do
    loss="$(json_field "$WORK/$run/metrics.jsonl" loss "$step")"
    awk -v x="$loss" 'BEGIN { exit !(x == x + 0 && x < 1e30 && x > -1e30) }' ||
      fail "$run: step $step loss '$loss' is not finite"
  done
done
loss1="$(json_field "$WORK/run_ck/metrics.jsonl" loss 1)"
[ "$loss1" = "$(json_field "$WORK/run_hf/metrics.jsonl" loss 1)" ] ||
  fail "step-1 loss differs between the converted checkpoint and the HF folder"
checks+=(batch-loss "$WORK/hf_tiny" "$WORK/tokens.bin" --seq-len 32 --batch-size 2 --bos 256
         --eos 257 --expect "$loss1" +)

# ---- B: a trained checkpoint -> HF -> ours -------------------------------------------------------
expect_exit 0 "$TITAN" tokenizer train --input README.md --vocab-size 300 --output "$WORK/tok"
expect_exit 0 "$TITAN" train --job.config_file configs/llama3/debug_model.toml \
  --job.dump_folder "$WORK/run" --model.hf_assets_path "$WORK/tok" --training.steps 2 \
  --training.local_batch_size 2 --training.seq_len 64 --validation.enable false \
  --checkpoint.enable true --checkpoint.folder ckpt --checkpoint.interval 1 \
  --checkpoint.last_save_in_hf true
ck="$WORK/run/ckpt/step-2"
[ -f "$ck/index.json" ] || { cat "$WORK/out" >&2; fail "training wrote no checkpoint $ck"; }

# A checkpoint folder resolves to its latest step; the tokenizer comes along.
expect_exit 0 "$TITAN" convert to-hf "$WORK/run/ckpt" "$WORK/hf"
[ -f "$WORK/hf/model.safetensors" ] && [ ! -e "$WORK/hf/model.safetensors.index.json" ] ||
  fail "expected a single model.safetensors"
cmp "$WORK/tok/tokenizer.json" "$WORK/hf/tokenizer.json" || fail "tokenizer.json not copied"
[ -f "$WORK/hf/tokenizer_config.json" ] || fail "no tokenizer_config.json"
config="$WORK/hf/config.json"
[ "$(json_get "$config" '["architectures"][0]')" = LlamaForCausalLM ] || fail "architectures"
[ "$(json_get "$config" '["hidden_size"]')" = 256 ] || fail "hidden_size"
[ "$(json_get "$config" '["torch_dtype"]')" = float32 ] || fail "torch_dtype"
special() {  # the id of special token $1 in tokenizer.json
  "$PY" -c "import json, sys
tokens = json.load(open(sys.argv[1]))['added_tokens']
print(next(t['id'] for t in tokens if t['content'] == sys.argv[2]))" "$WORK/tok/tokenizer.json" "$1"
}
bos="$(special '<|begin_of_text|>')"
eos="$(special '<|end_of_text|>')"
[ "$(json_get "$config" '["bos_token_id"]')" = "$bos" ] || fail "bos_token_id is not $bos"
[ "$(json_get "$config" '["eos_token_id"]')" = "$eos" ] || fail "eos_token_id is not $eos"

IDS_B="1 17 200 42 99 3 120 7 64 5 250 31 18 77 2 129 45 11 90 101 66 8 13 298 299"
expect_exit 0 "$TITAN" convert logits "$ck" --ids "$IDS_B" --out "$WORK/logits.safetensors"
expect_exit 0 "$TITAN" convert from-hf "$WORK/hf" "$WORK/back"
expect_exit 0 "$TITAN" convert diff "$ck" "$WORK/back"
expect_output "identical: 57 tensors"
# Sharded: the same tensors over several files plus the index.
expect_exit 0 "$TITAN" convert to-hf "$ck" "$WORK/hf_sharded" --max_shard_size 2MB
n_shards=$(ls "$WORK/hf_sharded" | grep -c '^model-000..-of-000..\.safetensors$' || true)
[ "$n_shards" -ge 3 ] || fail "expected >= 3 shards, got $n_shards"
[ -f "$WORK/hf_sharded/model.safetensors.index.json" ] || fail "no model.safetensors.index.json"
checks+=(check-logits "$WORK/hf" "$WORK/logits.safetensors" --ids "$IDS_B" +
         check-logits "$WORK/run/ckpt/step-2-hf" "$WORK/logits.safetensors" --ids "$IDS_B" +
         same-tensors "$WORK/hf" "$WORK/hf_sharded" +
         same-tensors "$WORK/hf" "$WORK/run/ckpt/step-2-hf" +
         same-config "$WORK/hf" "$WORK/run/ckpt/step-2-hf" +)

# bfloat16 export: no longer bit-identical to the float32 checkpoint, and diff says so.
expect_exit 0 "$TITAN" convert to-hf "$ck" "$WORK/hf_bf16" --dtype bfloat16
[ "$(json_get "$WORK/hf_bf16/config.json" '["torch_dtype"]')" = bfloat16 ] ||
  fail "bf16 torch_dtype"
expect_exit 1 "$TITAN" convert diff "$ck" "$WORK/hf_bf16"
expect_output "differs: tok_embeddings.weight: A Float .*, B BFloat16"

expect_exit 0 "$TITAN" convert logits "$WORK/hf_bf16" --ids "$IDS_B" \
  --out "$WORK/logits_bf16.safetensors"
checks+=(check-logits "$WORK/hf_bf16" "$WORK/logits_bf16.safetensors" --ids "$IDS_B")

# All transformers checks in one process (importing transformers takes seconds).
"$PY" "$REF" "${checks[@]}" || fail "transformers disagrees (see the FAIL lines above)"

# ---- a corrupt input: exit 1, naming the file ----------------------------------------------------
truncate -s 100000 "$WORK/hf_bf16/model.safetensors"
expect_exit 1 "$TITAN" convert from-hf "$WORK/hf_bf16" "$WORK/bad_out"
expect_output "hf_bf16/model.safetensors"
[ ! -e "$WORK/bad_out" ] || fail "a failed conversion left $WORK/bad_out"
echo "PASS test_hf_interop"
