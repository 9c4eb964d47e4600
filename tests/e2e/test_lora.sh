#!/usr/bin/env bash
# LoRA (model.converters = ["lora"], src/titan/models/lora.h) from a Hugging Face Llama folder
# that transformers wrote, with peft ($TITAN_PYTHON) as the reference:
#   - step 1 (adapters' B still zero) has the base model's loss exactly; the base weights stay
#     frozen: peft's PeftModel of the untouched base folder plus titan's exported adapter
#     (`convert to-peft`, and the run's own step-N-peft folder) gives titan's logits (1e-4);
#   - the merged export (`to-hf --merge-lora`, and checkpoint.last_save_in_hf's step-N-hf) gives
#     them too (transformers, 1e-4); `from-hf --adapter` imports the adapter bit for bit;
#     `titan generate` with the adapters gives the merged model's greedy tokens;
#   - FSDP 2, TP 2 and PP 2 reproduce the one-process loss curve (1e-5), a resumed run its
#     losses; Float8 (emulated) leaves the adapters in high precision;
#   - the recipe (scripts/sft_lora_example.sh: chat SFT of a Qwen3 folder) exports a PEFT folder
#     that peft loads onto Qwen3 with the run's logits;
#   - QLoRA (lora.quantize_base nf4): the base in NF4 under the same adapters trains, resumes bit
#     for bit, exports its PEFT adapter, shows in titan inspect; FSDP 2 and PP 2 reproduce its
#     losses, an FSDP run resumes; its wrong settings are refused;
#   - a LoRA checkpoint refused by plain to-hf, a target that names no layer: clear errors;
#   - the routed experts of a Qwen3-MoE folder: adapters that peft loads as its adapters of the
#     experts' parameters with the run's logits, merged, imported; EP 2 and experts split over
#     TP 2 reproduce the losses, a resumed run too; a DeepSeek-V3 folder (router biases, shared
#     experts, a dense layer) with every linear layer and the experts adapted, through peft.
# About 120 s.
source "$(dirname "$0")/parallel_lib.sh"

PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set; ctest sets it, by hand:" \
  "TITAN_PYTHON=\$(scripts/python_env.sh --print) bash $0 $TITAN"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=2
REF="$(dirname "$0")/hf_transformers_reference.py"
IDS="1 17 100 42 99 3 120 7 64 5 125 31 18 77 2 129 45 11 90 101 66 8 13 0"
IDS_QWEN="5 40 17 200 3 99 151 8 62 120"  # below the recipe tokenizer's vocabulary

# The tiny flavor's shapes (RoPE theta 5e5, llama3 scaling 8, 1, 4, 8192; rms eps 1e-5), float32.
"$PY" "$REF" save-random "$WORK/base" --seed 6 --hidden 64 --heads 4 --kv-heads 2 --vocab 300 \
  --intermediate 192 --norm-eps 1e-5 --rope-theta 500000 --llama3-rope 8 1 4 8192 \
  --max-positions 16384 + token-file "$WORK/tokens.bin" --vocab-size 258 --tokens 130 \
  >/dev/null || fail "transformers could not write the base folder"

common=(--job.config_file configs/llama3/debug_model.toml --model.flavor tiny
  --model.hf_assets_path "" --checkpoint.initial_load_path "$WORK/base"
  --checkpoint.initial_load_in_hf true --training.dataset tokens
  --training.dataset_path "$WORK/tokens.bin" --training.dataset_shuffle false
  --training.seq_len 32 --training.local_batch_size 4 --training.global_batch_size 4
  --training.steps 6 --training.mixed_precision_param float32 --metrics.log_freq 1
  --metrics.peak_flops 1e12 --lr_scheduler.warmup_steps 2 --optimizer.lr 1e-2
  --validation.enable false --checkpoint.enable true --checkpoint.interval 3
  --checkpoint.last_save_model_only false)
lora=(--model.converters lora --lora.rank 4 --lora.alpha 8
  --lora.target_modules "wq,wk,wv,wo,gate_proj,up_proj,down_proj")

train base 1 --training.steps 1 --checkpoint.enable false
train one 1 "${lora[@]}" --checkpoint.last_save_in_hf true --checkpoint.last_save_model_only true
grep -q "LoRA: rank 4, alpha 8 (scaling 2), dropout 0 on 14 linear layers" "$WORK/one.log" ||
  fail "no LoRA summary in the log"
[ "$(json_field "$WORK/one/metrics.jsonl" loss 1)" = "$(json_field "$WORK/base/metrics.jsonl" loss 1)" ] ||
  fail "step 1 of the LoRA run (B = 0) does not have the base model's loss"
first=$(json_field "$WORK/one/metrics.jsonl" loss 1)
last=$(json_field "$WORK/one/metrics.jsonl" loss 6)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall: $first -> $last"
echo "one: loss $first -> $last over 6 steps of adapters"
# titan inspect's memory estimate: gradients and AdamW moments for the adapters alone.
expect_exit 0 "$TITAN" inspect "${common[@]}" "${lora[@]}"
expect_output 'gradients \(fp32, LoRA adapters\)'
expect_output 'optimizer \(AdamW fp32, LoRA adapters\)'

# Export: the adapters (PEFT), the merged model; both give the LoRA model's logits.
ck="$WORK/one/checkpoint/step-6"
expect_exit 0 "$TITAN" convert logits "$ck" --ids "$IDS" --out "$WORK/lora_logits.safetensors"
expect_exit 0 "$TITAN" convert to-peft "$ck" "$WORK/peft"
expect_exit 0 "$TITAN" convert to-hf "$ck" "$WORK/merged" --merge-lora
"$PY" "$REF" check-peft "$WORK/base" "$WORK/peft" "$WORK/lora_logits.safetensors" --ids "$IDS" + \
  check-peft "$WORK/base" "$WORK/one/checkpoint/step-6-peft" "$WORK/lora_logits.safetensors" \
  --ids "$IDS" + check-logits "$WORK/merged" "$WORK/lora_logits.safetensors" --ids "$IDS" + \
  check-logits "$WORK/one/checkpoint/step-6-hf" "$WORK/lora_logits.safetensors" --ids "$IDS" ||
  fail "peft / transformers disagree with titan's LoRA model"
# Import: the base folder plus the PEFT adapter is the trained model, bit for bit.
expect_exit 0 "$TITAN" convert from-hf "$WORK/base" "$WORK/imported" --adapter "$WORK/peft"
expect_exit 0 "$TITAN" convert logits "$WORK/imported" --ids "$IDS" \
  --out "$WORK/imported_logits.safetensors"
cmp "$WORK/lora_logits.safetensors" "$WORK/imported_logits.safetensors" ||
  fail "the imported PEFT adapter does not give the trained model's logits"

# Generation (KV cache) with the adapters: greedy tokens of the merged folder.
gen=(generate --prompt_ids "1 17 100 42" --max_new_tokens 12 --temperature 0 --print_ids
  --tokenizer "")
lora_ids="$("$TITAN" "${gen[@]}" --checkpoint "$ck" 2>"$WORK/gen.err")" ||
  { cat "$WORK/gen.err" >&2; fail "generation from the LoRA checkpoint failed"; }
merged_ids="$("$TITAN" "${gen[@]}" --checkpoint "$WORK/merged" 2>"$WORK/gen.err")" ||
  { cat "$WORK/gen.err" >&2; fail "generation from the merged folder failed"; }
[ "$(wc -w <<<"$lora_ids")" = 16 ] && [ "$lora_ids" = "$merged_ids" ] ||
  fail "generation with the adapters ($lora_ids) differs from the merged model's ($merged_ids)"

# The same steps split over ranks, and resumed. From here the runs choose their own threads
# (cores / local ranks): two threads per process would oversubscribe the cores under `titan run`.
unset OMP_NUM_THREADS
train fsdp2 2 "${lora[@]}" --parallelism.data_parallel_shard_degree 2 \
  --training.local_batch_size 2
same_losses one fsdp2 loss
train tp2 2 "${lora[@]}" --parallelism.tensor_parallel_degree 2
same_losses one tp2 loss
train pp2 2 "${lora[@]}" --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_microbatch_size 2
same_losses one pp2 loss
resume_from one 3 resumed 1 "${lora[@]}"
train float8 1 "${lora[@]}" --model.converters "quantize.linear.float8,lora" \
  --quantize.linear.float8.emulate true --checkpoint.enable false --training.steps 2
grep -q "float8 linear layers (tensorwise recipe, emulated in float32): 14 converted" \
  "$WORK/float8.log" || fail "float8 did not convert the 14 base layers (and only them)"

# The recipe (configs/qwen3/sft_lora_tiny.toml): chat SFT of a Qwen3 folder with adapters on every
# linear layer; its PEFT folder on the base gives the run's logits.
expect_exit 0 env SFT_EXAMPLE_DIR="$WORK/example" TITAN="$TITAN" bash scripts/sft_lora_example.sh \
  --training.steps 6 --metrics.log_freq 1
grep -q "LoRA: rank 8, alpha 16 (scaling 2), dropout 0 on 14 linear layers" "$WORK/out" ||
  fail "the recipe did not adapt Qwen3's 14 linear layers"
ex="$WORK/example/run/checkpoint"
expect_exit 0 "$TITAN" convert logits "$ex/step-6" --ids "$IDS_QWEN" \
  --out "$WORK/qwen_logits.safetensors"
"$PY" "$REF" check-peft "$WORK/example/model" "$ex/step-6-peft" "$WORK/qwen_logits.safetensors" \
  --ids "$IDS_QWEN" + check-logits "$ex/step-6-hf" "$WORK/qwen_logits.safetensors" \
  --ids "$IDS_QWEN" || fail "peft / transformers disagree with the recipe's Qwen3 LoRA model"

# QLoRA: the 14 frozen base weights in NF4 under the same adapters. Step 1 (B = 0) is the NF4
# base's loss: near the float base's, not equal (4-bit weights); the loss falls; a resumed run
# (the base read and quantized again) repeats the losses bit for bit; the final export is the
# PEFT adapter alone.
train qlora 1 "${lora[@]}" --lora.quantize_base nf4 --checkpoint.last_save_in_hf true \
  --checkpoint.last_save_model_only true
# 14 layers: 2 blocks x (4 attention + 3 feed-forward); 384 KiB of float32 in 49.6 KiB.
summary="QLoRA: the frozen base of 14 linear layers \(98,304 weights\) from .* held in NF4: "
summary+="384(\.0+)? KiB -> 49\.[0-9]+ KiB \(4\.1[0-9]* bits per weight\)"
grep -qE "$summary" "$WORK/qlora.log" ||
  { grep QLoRA "$WORK/qlora.log" >&2; fail "no QLoRA summary in the log"; }
q1=$(json_field "$WORK/qlora/metrics.jsonl" loss 1)
q6=$(json_field "$WORK/qlora/metrics.jsonl" loss 6)
base1=$(json_field "$WORK/base/metrics.jsonl" loss 1)
awk -v q="$q1" -v b="$base1" \
  'BEGIN { d = (q - b) / b; if (d < 0) d = -d; exit !(d > 0 && d < 0.02) }' ||
  fail "QLoRA step 1 loss $q1 is not within 2% of (and different from) the float base's $base1"
awk -v a="$q1" -v b="$q6" 'BEGIN { exit !(b < a) }' || fail "QLoRA loss did not fall: $q1 -> $q6"
echo "qlora: step 1 loss $q1 (float base $base1) -> $q6"
[ -f "$WORK/qlora/checkpoint/step-6-peft/adapter_model.safetensors" ] ||
  fail "QLoRA wrote no PEFT adapter"
[ ! -e "$WORK/qlora/checkpoint/step-6-hf" ] || fail "QLoRA wrote a merged export of its NF4 base"
resume_from qlora 3 qresumed 1 "${lora[@]}" --lora.quantize_base nf4
# A QLoRA checkpoint holds no frozen base: titan reads it (in float) from the folder its state
# names, so the checkpoint's logits are peft's over the float base with the run's PEFT adapter.
expect_exit 0 "$TITAN" convert logits "$WORK/qlora/checkpoint/step-6" --ids "$IDS" \
  --out "$WORK/qlora_logits.safetensors"
expect_output "a QLoRA checkpoint; its frozen base weights from $WORK/base"
"$PY" "$REF" check-peft "$WORK/base" "$WORK/qlora/checkpoint/step-6-peft" \
  "$WORK/qlora_logits.safetensors" --ids "$IDS" ||
  fail "peft disagrees with titan's QLoRA checkpoint over the float base"
mv "$WORK/base" "$WORK/base_away"
expect_exit 1 "$TITAN" convert to-peft "$WORK/qlora/checkpoint/step-6" "$WORK/qpeft"
expect_output "a QLoRA checkpoint .*the Hugging Face folder '$WORK/base', which is not there"
mv "$WORK/base_away" "$WORK/base"
expect_exit 0 "$TITAN" inspect "${common[@]}" "${lora[@]}" --lora.quantize_base nf4
expect_output 'frozen base \(NF4, QLoRA\) +0\.000 GiB'
grep -rqs 'qlora_base' "$WORK/qlora/checkpoint/step-3" ||
  fail "the checkpoint does not record the NF4 base"
expect_exit 2 "$TITAN" train "${common[@]}" "${lora[@]}" --job.dump_folder "$WORK/q1" \
  --lora.quantize_base nf4 --checkpoint.initial_load_path "" --checkpoint.initial_load_in_hf false
expect_output 'lora.quantize_base = "nf4" quantizes a pretrained base, read from a Hugging Face'
expect_exit 2 "$TITAN" train "${common[@]}" "${lora[@]}" --job.dump_folder "$WORK/q2" \
  --lora.quantize_base nf5
expect_output 'lora.quantize_base = "nf5" is not a base quantization; did you mean .nf4.'
expect_exit 2 "$TITAN" train "${common[@]}" --model.converters "quantize.linear.float8,lora" \
  --quantize.linear.float8.emulate true --lora.quantize_base nf4 --job.dump_folder "$WORK/q3"
expect_output 'and the float8 linear converter both claim the base'
# Over ranks: FSDP leaves the frozen block linears whole on each rank (each holds the NF4 base);
# FSDP 2 and PP 2 reproduce the one-process curve, an FSDP run resumes; TP is refused.
train qfsdp2 2 "${lora[@]}" --lora.quantize_base nf4 --parallelism.data_parallel_shard_degree 2 \
  --training.local_batch_size 2
same_losses qlora qfsdp2 loss
resume_from qfsdp2 3 qfsdp2_resumed 2 "${lora[@]}" --lora.quantize_base nf4 \
  --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2
train qpp2 2 "${lora[@]}" --lora.quantize_base nf4 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_microbatch_size 2 --checkpoint.enable false
same_losses qlora qpp2 loss
expect_exit 2 timeout 120 "$TITAN" run --nproc_per_node 2 -- train "${common[@]}" "${lora[@]}" \
  --lora.quantize_base nf4 --parallelism.tensor_parallel_degree 2 --job.dump_folder "$WORK/q4"
expect_output 'lora.quantize_base = "nf4" with parallelism.tensor_parallel_degree = 2 is not supported'

# Errors.
expect_exit 2 "$TITAN" convert to-hf "$ck" "$WORK/nomerge"
expect_output "holds LoRA adapters.*HINT: add --merge-lora"
expect_exit 2 "$TITAN" train "${common[@]}" "${lora[@]}" --job.dump_folder "$WORK/e1" \
  --lora.target_modules "wq,q_prj"
expect_output "'q_prj' matches no linear layer.*did you mean 'q_proj'"
expect_exit 2 "$TITAN" train "${common[@]}" "${lora[@]}" --job.dump_folder "$WORK/e2" \
  --lora.rank 0
expect_output "lora.rank = 0 must be at least 1"
# The routed experts of a Qwen3-MoE folder that transformers wrote (fused gate_up_proj and
# down_proj per layer): adapters per expert, exported as PEFT's adapters of those parameters
# (target_parameters), which peft loads with the run's logits; the merged export, the import;
# expert parallelism and experts split over tp reproduce the losses; a resumed run too.
"$PY" "$(dirname "$0")/qwen3_transformers_reference.py" save-random "$WORK/moe_base" --seed 3 \
  --experts 4 --top-k 2 --moe-intermediate 64 >/dev/null ||
  fail "transformers could not write the Qwen3-MoE folder"
common=(--job.config_file configs/llama3/debug_model.toml --model.name qwen3
  --model.flavor tiny_moe --model.hf_assets_path "" --checkpoint.initial_load_path "$WORK/moe_base"
  --checkpoint.initial_load_in_hf true --training.dataset tokens
  --training.dataset_path "$WORK/tokens.bin" --training.dataset_shuffle false
  --training.seq_len 32 --training.local_batch_size 4 --training.global_batch_size 4
  --training.steps 6 --training.mixed_precision_param float32 --metrics.log_freq 1
  --lr_scheduler.warmup_steps 2 --optimizer.lr 1e-2 --validation.enable false
  --checkpoint.enable true --checkpoint.interval 3 --checkpoint.last_save_model_only false)
moe_lora=(--model.converters lora --lora.rank 4 --lora.alpha 8
  --lora.target_modules "q_proj,v_proj,experts")
train moe 1 "${moe_lora[@]}" --checkpoint.last_save_in_hf true \
  --checkpoint.last_save_model_only true
grep -q "dropout 0 on 4 linear layers and the routed experts of 2 MoE layers" "$WORK/moe.log" ||
  fail "LoRA did not adapt the routed experts of the 2 MoE layers"
train moe_ep 2 "${moe_lora[@]}" --parallelism.expert_parallel_degree 2 \
  --training.local_batch_size 2 --checkpoint.enable false
same_losses moe moe_ep loss
train moe_etp 2 "${moe_lora[@]}" --parallelism.tensor_parallel_degree 2 \
  --parallelism.expert_tensor_parallel_degree 2 --checkpoint.enable false
same_losses moe moe_etp loss
resume_from moe 3 moe_resumed 1 "${moe_lora[@]}"
ck="$WORK/moe/checkpoint/step-6"
expect_exit 0 "$TITAN" convert logits "$ck" --ids "$IDS" --out "$WORK/moe_logits.safetensors"
expect_exit 0 "$TITAN" convert to-peft "$ck" "$WORK/moe_peft"
grep -q '"experts.gate_up_proj"' "$WORK/moe_peft/adapter_config.json" ||
  fail "the PEFT config does not target the experts' parameters"
expect_exit 0 "$TITAN" convert from-hf "$WORK/moe_base" "$WORK/moe_imported" \
  --adapter "$WORK/moe_peft"
expect_exit 0 "$TITAN" convert logits "$WORK/moe_imported" --ids "$IDS" \
  --out "$WORK/moe_imported_logits.safetensors"
cmp "$WORK/moe_logits.safetensors" "$WORK/moe_imported_logits.safetensors" ||
  fail "the imported PEFT adapter of the experts does not give the trained model's logits"
# DeepSeek-V3 (dense first layer, shared experts, router biases that transformers' folder holds):
# every linear layer and the routed experts. peft reads the names gate_proj / up_proj /
# down_proj / gate on such models as the experts' and router's, so titan's config names those
# layers by parameter; the run's routing is the folder's (its biases loaded, and frozen).
"$PY" "$(dirname "$0")/deepseek_v3_transformers_reference.py" save-random "$WORK/ds_base" \
  --seed 1 >/dev/null || fail "transformers could not write the DeepSeek-V3 folder"
train ds 1 "${moe_lora[@]}" --model.name deepseek_v3 --model.flavor tiny \
  --checkpoint.initial_load_path "$WORK/ds_base" --lora.target_modules "all-linear,experts" \
  --checkpoint.interval 10 --checkpoint.last_save_in_hf true --checkpoint.last_save_model_only true
ck="$WORK/ds/checkpoint/step-6"
expect_exit 0 "$TITAN" convert logits "$ck" --ids "$IDS" --out "$WORK/ds_logits.safetensors"
"$PY" "$REF" check-peft "$WORK/moe_base" "$WORK/moe_peft" "$WORK/moe_logits.safetensors" \
  --ids "$IDS" + check-logits "$WORK/moe/checkpoint/step-6-hf" "$WORK/moe_logits.safetensors" \
  --ids "$IDS" + check-peft "$WORK/ds_base" "$ck-peft" "$WORK/ds_logits.safetensors" \
  --ids "$IDS" + check-logits "$ck-hf" "$WORK/ds_logits.safetensors" --ids "$IDS" ||
  fail "peft / transformers disagree with titan's LoRA on the Qwen3-MoE or DeepSeek-V3 folder"
expect_exit 2 "$TITAN" train "${common[@]}" "${moe_lora[@]}" --job.dump_folder "$WORK/e3" \
  --lora.target_modules "experts.w1"
expect_output "names experts.w1 without experts.w3.*HINT: list both, or experts.gate_up_proj"
echo "PASS test_lora"
