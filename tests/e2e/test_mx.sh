#!/usr/bin/env bash
# MXFP8 (the OCP MX format: blocks of 32 e4m3 values sharing a power-of-two E8M0 scale): titan's
# cast (models/common/mx.h) against the pinned torchao's reference to_mx / to_dtype
# (tests/e2e/mx_reference.py writes random and edge-case inputs with torchao's bytes; the unit
# test Mx.MatchesTorchao, in test_models beside the titan binary, checks ours bit for bit), and
# the MX linear's three GEMMs against torchao's casts with float32 products (Mx.LinearMatchesTorchaoCasts);
# then training with the converter (below); the MoE experts' grouped GEMMs in MXFP8 and float8
# against torchao, and training with their converters.
source "$(dirname "$0")/parallel_lib.sh"
python_and_tests test_models
expect_exit 0 "$PY" "$(dirname "$0")/mx_reference.py" "$WORK/mx.safetensors"
TITAN_MX_FIXTURE="$WORK/mx.safetensors" expect_exit 0 "$TESTS" --gtest_filter=Mx.MatchesTorchao
expect_output "MX cast vs torchao"
! grep -q "SKIPPED" "$WORK/out" || fail "the comparison with torchao was skipped"
grep "vs torchao" "$WORK/out"
TITAN_MX_FIXTURE="$WORK/mx.safetensors" expect_exit 0 "$TESTS" --gtest_filter=Mx.LinearMatchesTorchaoCasts
expect_output "MX linear vs torchao's casts: output and both gradients equal"
# The MoE experts' grouped GEMMs: MXFP8 against torchao's emulated MXFP8 grouped GEMM, float8
# rowwise against torchao's casts per expert group (forward and both gradients).
TITAN_MX_FIXTURE="$WORK/mx.safetensors" expect_exit 0 "$TESTS" \
  --gtest_filter='MoeQuant.MxGroupedMatchesTorchao:MoeQuant.Float8Grouped*MatchesTorchaoCasts'
! grep -q "SKIPPED" "$WORK/out" || fail "the grouped comparisons with torchao were skipped"
grep "grouped GEMM.* vs torchao" "$WORK/out"
grep -q "one-launch form" "$WORK/out" || fail "the one-launch float8 form was not compared"

# Training with model.converters = ["quantize.linear.mx"]: the debug model's loss over 50 steps
# within 2% of bf16's; FSDP 2 and TP 2 reproduce the one-process MX run (the blocks of 32 fall
# within each rank's shard, so the casts are the whole tensors'; the sums of the reductions
# add in another order, and a last-bit difference that moves a value across an e4m3 rounding
# boundary moves it by up to 1/16, hence 1e-4 rather than the float32 runs' 1e-5).
mx=(--model.converters quantize.linear.mx)
long=(--model.flavor debugmodel --training.steps 50 --training.mixed_precision_param bfloat16
  --validation.enable false --checkpoint.enable false --training.local_batch_size 8
  --lr_scheduler.warmup_steps 10)
train bf16 1 "${long[@]}"
train mx50 1 "${long[@]}" "${mx[@]}"
grep -q "MXFP8 linear layers (mxfp8_cublas recipe, blocks of 32, emulated.*): 42 converted, 1 kept" \
  "$WORK/mx50.log" || fail "no MX conversion line"
# last_loss_within REF NAME LABEL: NAME's last loss within 2% of REF's, printed.
last_loss_within() {
  local a b
  a=$(json_field "$WORK/$1/metrics.jsonl" loss -1)
  b=$(json_field "$WORK/$2/metrics.jsonl" loss -1)
  awk -v a="$a" -v b="$b" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d < 0.02) }' ||
    fail "$3: last loss $b against $1's $a (over 2%)"
  awk -v l="$3" -v r="$1" -v a="$a" -v b="$b" \
    'BEGIN { printf "%s: last loss %.5f, %s %.5f, %.2f%% apart\n", l, b, r, a, 100 * (b - a) / a }'
}
last_loss_within bf16 mx50 "MXFP8 linear layers, 50 steps"
train mx_one 1 "${mx[@]}" --training.local_batch_size 8 --validation.local_batch_size 4
train mx_fsdp2 2 "${mx[@]}" --training.local_batch_size 4 --validation.local_batch_size 2
same_losses mx_one mx_fsdp2 loss 1e-4
train mx_tp2 2 "${mx[@]}" --training.local_batch_size 8 --validation.local_batch_size 4 \
  --parallelism.tensor_parallel_degree 2
same_losses mx_one mx_tp2 loss 1e-4
expect_exit 2 "$TITAN" train "${mx[@]}" --quantize.linear.mx.recipe_name mxfp4_cutlass
expect_output "recipe_name 'mxfp4_cutlass' is not built"

# The MoE experts' grouped GEMMs (model.converters quantize.grouped_mm.float8 / .mx, fqns
# "experts"): Qwen3's tiny_moe (2 MoE layers of 4 experts) trains 30 steps within 2% of its
# high-precision loss; expert parallelism (2 ranks, 2 experts each) reproduces the one-process
# quantized run (each expert sees the same tokens in the same order, so the same scales).
moe=(--model.name qwen3 --model.flavor tiny_moe --model.hf_assets_path "" --optimizer.lr 3e-3
  --validation.enable false --checkpoint.enable false)
f8e=(--model.converters quantize.grouped_mm.float8 --quantize.grouped_mm.float8.fqns experts)
mxe=(--model.converters quantize.grouped_mm.mx --quantize.grouped_mm.mx.fqns experts)
train moe_hp 1 "${moe[@]}" --training.steps 30 --training.local_batch_size 8
for kind in f8e mxe; do
  declare -n args="$kind"
  train "moe_$kind" 1 "${moe[@]}" "${args[@]}" --training.steps 30 --training.local_batch_size 8
  grep -q "MoE grouped GEMMs in .*: 2 MoE layers converted (layers.0.moe.experts, layers.1.moe.experts)" \
    "$WORK/moe_$kind.log" || fail "$kind: no conversion line"
  last_loss_within moe_hp "moe_$kind" "tiny_moe experts $kind, 30 steps"
  train "moe_${kind}_ref" 1 "${moe[@]}" "${args[@]}" --training.local_batch_size 8
  train "moe_${kind}_ep2" 2 "${moe[@]}" "${args[@]}" --training.local_batch_size 4 \
    --parallelism.expert_parallel_degree 2
  grep -q "expert parallel over ep 2" "$WORK/moe_${kind}_ep2.log" || fail "$kind: no EP line"
  same_losses "moe_${kind}_ref" "moe_${kind}_ep2" loss 1e-4
  unset -n args
done
expect_exit 2 "$TITAN" train "${moe[@]}" --model.converters quantize.grouped_mm.mx
expect_output "quantize.grouped_mm.mx.fqns = \[\"experts\"\] selects every MoE layer"
expect_exit 2 "$TITAN" train "${moe[@]}" "${f8e[@]}" --quantize.grouped_mm.float8.fqns attention
expect_output "selects none of the model's MoE experts .layers.0.moe.experts, layers.1.moe.experts."
echo "PASS test_mx"
