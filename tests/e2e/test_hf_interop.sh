#!/usr/bin/env bash
# Hugging Face interop, end to end. (A) An HF Llama folder written by an independent Python
# reference (tests/e2e/hf_llama_reference.py: safetensors parsed with json + struct,
# transformers' Llama forward in plain torch) converts to our checkpoint, gives the reference's
# logits, and converts back byte-identically. (B) A debug model trained here with its own
# tokenizer and a checkpoint converts to HF (single file, sharded, bf16; tokenizer files and
# token ids included); the reference reproduces our logits from the HF folder; from-hf gives
# back bit-identical tensors; the trainer's checkpoint.last_save_in_hf export equals to-hf.
# Plus usage errors (exit 2) and a corrupt file (exit 1, named).
# Logits tolerance: max |ours - reference| <= 1e-4, both in float32.
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
REF="$(dirname "$0")/hf_llama_reference.py"
export OMP_NUM_THREADS=2

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

# ---- A: an HF folder from the reference -> ours -> HF --------------------------------------------
IDS_A="1 17 100 42 99 3 120 7 64 5 125 31 18 77 2 129 45 11 90 101 66 8 13 0"  # vocab 130
"$PY" "$REF" random "$WORK/hf_py" --seed 3
expect_exit 0 "$TITAN" convert from-hf "$WORK/hf_py" "$WORK/ck_py"
expect_exit 0 "$TITAN" convert logits "$WORK/ck_py" --ids "$IDS_A" \
  --out "$WORK/logits_py.safetensors"
# The HF folder also loads directly, with the very same logits.
expect_exit 0 "$TITAN" convert logits "$WORK/hf_py" --ids "$IDS_A" \
  --out "$WORK/logits_py_hf.safetensors"
cmp "$WORK/logits_py.safetensors" "$WORK/logits_py_hf.safetensors" ||
  fail "logits from the HF folder and from its conversion differ"
expect_exit 0 "$TITAN" convert to-hf "$WORK/ck_py" "$WORK/hf_py_back"
"$PY" "$REF" check --logits "$WORK/hf_py" "$WORK/logits_py.safetensors" --ids "$IDS_A" \
  --same "$WORK/hf_py" "$WORK/hf_py_back" || fail "reference folder: logits or round trip differ"
scaling='["rope_scaling"]["original_max_position_embeddings"]'
[ "$(json_get "$WORK/hf_py_back/config.json" "$scaling")" = 64 ] ||
  fail "rope_scaling did not survive the round trip"

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
"$PY" "$REF" check --logits "$WORK/hf" "$WORK/logits.safetensors" --ids "$IDS_B" \
  --same "$WORK/hf" "$WORK/hf_sharded" --same "$WORK/hf" "$WORK/run/ckpt/step-2-hf" ||
  fail "trained model: logits, sharded export or the trainer's last_save_in_hf export differ"

# bfloat16 export: no longer bit-identical to the float32 checkpoint, and diff says so.
expect_exit 0 "$TITAN" convert to-hf "$ck" "$WORK/hf_bf16" --dtype bfloat16
[ "$(json_get "$WORK/hf_bf16/config.json" '["torch_dtype"]')" = bfloat16 ] ||
  fail "bf16 torch_dtype"
expect_exit 1 "$TITAN" convert diff "$ck" "$WORK/hf_bf16"
expect_output "differs: tok_embeddings.weight: A Float .*, B BFloat16"

# ---- a corrupt input: exit 1, naming the file ----------------------------------------------------
truncate -s 100000 "$WORK/hf_bf16/model.safetensors"
expect_exit 1 "$TITAN" convert from-hf "$WORK/hf_bf16" "$WORK/bad_out"
expect_output "hf_bf16/model.safetensors"
[ ! -e "$WORK/bad_out" ] || fail "a failed conversion left $WORK/bad_out"
echo "PASS test_hf_interop"
