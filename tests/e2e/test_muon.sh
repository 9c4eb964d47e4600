#!/usr/bin/env bash
# Muon (optimizer.name = "Muon"):
# - one step on given matrices and gradients equals the pinned torch.optim.Muon
#   (tests/e2e/muon_reference.py writes the cases; the unit test Muon.MatchesTorch, in
#   test_components beside the titan binary, checks ours against them);
# - distributed Muon (parallel/muon_exchange.h): FSDP 2, TP 2, FSDP 2 x TP 2, PP 2 x FSDP 2, CP 2
#   and HSDP 2 x 2 reproduce the one-process loss curve within 1e-5 relative, the first three its
#   final parameters within 5e-3 (a gradient
#   that differs in its last float32 bit, as reductions in another order make it, can round one
#   of Newton–Schulz's bf16 values the other way, which moves an update element by a bf16 ulp
#   times the learning rate; and AdamW's normalized step turns such differences in the tiny
#   gradients of rarely seen embedding rows into up to 2 lr a step); expert parallelism the same
#   on the tiny MoE model;
# - a run resumed from a checkpoint continues with the same losses, bit for bit, in one process
#   and under FSDP;
# - bf16 optimizer states: the loss over 50 steps within 1% of float32 states', AdamW and Muon;
# - settings out of range are refused naming the key.
source "$(dirname "$0")/parallel_lib.sh"
python_and_tests test_components

expect_exit 0 "$PY" "$(dirname "$0")/muon_reference.py" "$WORK/muon.safetensors"
TITAN_MUON_FIXTURE="$WORK/muon.safetensors" expect_exit 0 "$TESTS" --gtest_filter=Muon.MatchesTorch
expect_output "Muon vs torch.optim.Muon"
! grep -q "SKIPPED" "$WORK/out" || fail "the comparison with torch was skipped"
grep "vs torch" "$WORK/out"

# The training runs choose their own threads (cores / local ranks): the reference's two threads
# per process would oversubscribe the cores under `titan run`.
unset OMP_NUM_THREADS
muon=(--optimizer.name Muon --optimizer.lr 0.02 --optimizer.muon_adamw_lr 2e-3)
train one 1 "${muon[@]}" --training.local_batch_size 8 --validation.local_batch_size 4
grep -q "optimizer Muon: 42 matrices orthogonalized locally; the other 15 parameters take AdamW" \
  "$WORK/one.log" || fail "no Muon line in the one-process run"
# Final parameters within 5e-3 of the one-process run (see above).
muon_params() {
  "$TITAN" convert diff "$WORK/one/checkpoint/step-10" "$WORK/$1/checkpoint/step-10" \
    --atol 5e-3 --rtol 0 >"$WORK/out" 2>&1 || { cat "$WORK/out" >&2; fail "$1: final parameters"; }
  echo "$1: final parameters $(tail -n 1 "$WORK/out")"
}
train fsdp2 2 "${muon[@]}" --training.local_batch_size 4 --validation.local_batch_size 2
grep -q "optimizer Muon: 42 matrices orthogonalized by owners over 'world'" "$WORK/fsdp2.log" ||
  fail "FSDP 2 did not exchange the matrices"
same_losses one fsdp2 loss
muon_params fsdp2
train tp2 2 "${muon[@]}" --training.local_batch_size 8 --validation.local_batch_size 4 \
  --parallelism.tensor_parallel_degree 2
same_losses one tp2 loss
muon_params tp2
train fsdp2_tp2 4 "${muon[@]}" --training.local_batch_size 4 --validation.local_batch_size 2 \
  --parallelism.tensor_parallel_degree 2
grep -q "orthogonalized by owners over 'world'" "$WORK/fsdp2_tp2.log" ||
  fail "FSDP 2 x TP 2 did not exchange over the 4 ranks"
same_losses one fsdp2_tp2 loss
muon_params fsdp2_tp2

# Pipeline stages exchange their own matrices (pp 2 x FSDP 2: over each stage's 2 ranks); context
# parallelism's ranks hold FSDP shards (over dp_shard x cp); HSDP's replica groups orthogonalize
# their own equal copies (FSDP 2 within, replicated 2x).
train pp2_fsdp2 4 "${muon[@]}" --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule 1F1B --training.local_batch_size 4 \
  --validation.local_batch_size 2
grep -q "orthogonalized by owners over .*rank 0 of 2" "$WORK/pp2_fsdp2.log" ||
  fail "pp 2 x FSDP 2 did not exchange within a stage"
same_losses one pp2_fsdp2 loss
train cp2 2 "${muon[@]}" --parallelism.context_parallel_degree 2 \
  --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8 \
  --validation.local_batch_size 4
same_losses one cp2 loss
train hsdp2x2 4 "${muon[@]}" --parallelism.data_parallel_replicate_degree 2 \
  --training.local_batch_size 2 --validation.local_batch_size 1
same_losses one hsdp2x2 loss

# Resumed runs: the same losses as the uninterrupted ones, to the last printed digit.
exact_losses() {
  cmp -s <(grep '"loss":' "$WORK/$1/metrics.jsonl" | tail -n 5 | sed -E 's/.*"loss":([^,]*).*/\1/') \
    <(grep '"loss":' "$WORK/$2/metrics.jsonl" | sed -E 's/.*"loss":([^,]*).*/\1/') ||
    fail "$2: the resumed losses are not $1's steps 6-10 exactly"
  echo "$2: steps 6-10 bit-identical to $1's"
}
resume_from one 5 one_resumed 1 "${muon[@]}" --training.local_batch_size 8 \
  --validation.local_batch_size 4
exact_losses one one_resumed
resume_from fsdp2 5 fsdp2_resumed 2 "${muon[@]}" --training.local_batch_size 4 \
  --validation.local_batch_size 2
exact_losses fsdp2 fsdp2_resumed

# Expert parallelism: the tiny MoE model's 4 experts, 2 per rank; Muon takes the expert stacks.
moe=(--job.config_file configs/llama3/debug_model.toml --model.name qwen3 --model.flavor tiny_moe
  --model.hf_assets_path "" --training.seq_len 64 --training.global_batch_size 8 --training.steps 8
  --training.mixed_precision_param float32 --lr_scheduler.warmup_steps 3 --validation.enable false
  --metrics.log_freq 1 --metrics.peak_flops 1e12 "${muon[@]}")
expect_exit 0 timeout 300 "$TITAN" train "${moe[@]}" --training.local_batch_size 8 \
  --job.dump_folder "$WORK/moe_one"
grep -q "optimizer Muon: .* matrices orthogonalized locally" "$WORK/out" || fail "no Muon line"
expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- train "${moe[@]}" \
  --training.local_batch_size 4 --parallelism.expert_parallel_degree 2 \
  --job.dump_folder "$WORK/moe_ep2"
expect_output "expert parallel over ep 2"
same_losses moe_one moe_ep2 loss

# bf16 optimizer states (optimizer.state_dtype): AdamW's moments and Muon's momentum in bf16 with
# float32 math; over 50 steps the loss falls and stays within 1% of the float32 states'; `titan inspect`
# counts half the optimizer's bytes; a resumed run continues bit for bit.
long=(--training.steps 50 --checkpoint.interval 25 --validation.enable false
  --training.local_batch_size 8 --lr_scheduler.warmup_steps 10)
for opt in adamw muon; do
  args=(); [ $opt = muon ] && args=("${muon[@]}")
  train ${opt}_f32 1 "${long[@]}" "${args[@]}"
  train ${opt}_bf16 1 "${long[@]}" "${args[@]}" --optimizer.state_dtype bfloat16
  a=$(json_field "$WORK/${opt}_f32/metrics.jsonl" loss -1)
  b=$(json_field "$WORK/${opt}_bf16/metrics.jsonl" loss -1)
  awk -v a="$a" -v b="$b" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d < 0.01) }' ||
    fail "$opt: step-50 loss with bf16 states $b, with float32 states $a (over 1%)"
  first=$(json_field "$WORK/${opt}_f32/metrics.jsonl" loss 1)
  awk -v a="$first" -v b="$a" 'BEGIN { exit !(b < a - 1) }' || fail "$opt: the loss did not fall: $first -> $a"
  awk -v a="$a" -v b="$b" -v o="$opt" 'BEGIN { printf "%s: step-50 loss %.5f (float32 states), %.5f (bf16 states), %.3f%% apart\n", o, a, b, 100 * (b - a) / a }'
done
expect_exit 0 "$TITAN" inspect --job.config_file configs/llama3/debug_model.toml \
  --optimizer.state_dtype bfloat16
expect_output "optimizer \(AdamW bf16\)"
rm -rf "$WORK/muon_bf16_resumed"; mkdir -p "$WORK/muon_bf16_resumed/checkpoint"
cp -r "$WORK/muon_bf16/checkpoint/step-25" "$WORK/muon_bf16_resumed/checkpoint/"
train muon_bf16_resumed 1 "${long[@]}" "${muon[@]}" --optimizer.state_dtype bfloat16
cmp -s <(grep '"loss":' "$WORK/muon_bf16/metrics.jsonl" | tail -n 25 | sed -E 's/.*"loss":([^,]*).*/\1/') \
  <(grep '"loss":' "$WORK/muon_bf16_resumed/metrics.jsonl" | sed -E 's/.*"loss":([^,]*).*/\1/') ||
  fail "bf16 states: the resumed losses differ"
echo "muon_bf16_resumed: steps 26-50 bit-identical"

# Settings out of range name the key.
expect_exit 2 "$TITAN" train --optimizer.name Muon --optimizer.muon_adjust_lr_fn rms
expect_output "optimizer.muon_adjust_lr_fn must be one of original, match_rms_adamw, spectral_unclamped; got 'rms'"
expect_exit 2 "$TITAN" train --optimizer.name Muon --optimizer.muon_ns_steps 100
expect_output "optimizer.muon_ns_steps must be below 100"
expect_exit 2 "$TITAN" train --optimizer.name muon
expect_output "optimizer.name must be one of AdamW, Adam, Muon; got 'muon'"
echo "PASS test_muon"
