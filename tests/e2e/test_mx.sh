#!/usr/bin/env bash
# MXFP8 (the OCP MX format: blocks of 32 e4m3 values sharing a power-of-two E8M0 scale): titan's
# cast (models/common/mx.h) against the pinned torchao's reference to_mx / to_dtype
# (tests/e2e/mx_reference.py writes random and edge-case inputs with torchao's bytes; the unit
# test Mx.MatchesTorchao, in test_models beside the titan binary, checks ours bit for bit), and
# the MX linear's three GEMMs against torchao's casts with float32 products (Mx.LinearMatchesTorchaoCasts);
# then training with the converter (below).
source "$(dirname "$0")/parallel_lib.sh"
python_and_tests test_models
expect_exit 0 "$PY" "$(dirname "$0")/mx_reference.py" "$WORK/mx.safetensors"
TITAN_MX_FIXTURE="$WORK/mx.safetensors" expect_exit 0 "$TESTS" --gtest_filter=Mx.MatchesTorchao
expect_output "MX cast vs torchao"
! grep -q "SKIPPED" "$WORK/out" || fail "the comparison with torchao was skipped"
grep "vs torchao" "$WORK/out"
TITAN_MX_FIXTURE="$WORK/mx.safetensors" expect_exit 0 "$TESTS" --gtest_filter=Mx.LinearMatchesTorchaoCasts
expect_output "MX linear vs torchao's casts: output and both gradients equal"

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
a=$(json_field "$WORK/bf16/metrics.jsonl" loss -1)
b=$(json_field "$WORK/mx50/metrics.jsonl" loss -1)
awk -v a="$a" -v b="$b" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d < 0.02) }' ||
  fail "step-50 loss in MXFP8 $b, in bf16 $a (over 2%)"
awk -v a="$a" -v b="$b" 'BEGIN { printf "step-50 loss: bf16 %.5f, MXFP8 %.5f, %.2f%% apart\n", a, b, 100 * (b - a) / a }'
train mx_one 1 "${mx[@]}" --training.local_batch_size 8 --validation.local_batch_size 4
train mx_fsdp2 2 "${mx[@]}" --training.local_batch_size 4 --validation.local_batch_size 2
same_losses mx_one mx_fsdp2 loss 1e-4
train mx_tp2 2 "${mx[@]}" --training.local_batch_size 8 --validation.local_batch_size 4 \
  --parallelism.tensor_parallel_degree 2
same_losses mx_one mx_tp2 loss 1e-4
expect_exit 2 "$TITAN" train "${mx[@]}" --quantize.linear.mx.recipe_name mxfp4_cutlass
expect_output "recipe_name 'mxfp4_cutlass' is not built"
echo "PASS test_mx"
