# Pipeline parallelism end to end, real processes over Gloo: 10 float32 steps of the narrow debug
# model (6 layers; seq 64, global batch 8, validation every 5 steps) in one process, then pp 2 with
# the debug config's Interleaved1F1B (2 stages per rank), pp 2 with ZBVZeroBubble (V placement), the
# same with the fused linear + cross-entropy on the last stage (compile.components loss), and pp 2 x
# FSDP 2 with 1F1B. Each gives the single-process training and validation losses within 1e-5
# relative and final parameters within the data-parallel tests' tolerance. A checkpoint saved under
# pp 2 exports to Hugging Face safetensors equal to the checkpoint and resumes in one process; wrong
# microbatch counts stop at start-up; a rank killed mid-schedule ends the job non-zero, naming the
# rank.
source "$(dirname "$0")/parallel_lib.sh"

train single 1 --training.local_batch_size 8 --validation.local_batch_size 4
pp=(--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 1
    --training.local_batch_size 8 --validation.local_batch_size 4)
train pp2 2 "${pp[@]}"
train pp2_zbv 2 "${pp[@]}" --parallelism.pipeline_parallel_schedule ZBVZeroBubble
train pp2_zbv_fused_loss 2 "${pp[@]}" --parallelism.pipeline_parallel_schedule ZBVZeroBubble \
  --compile.enable true --compile.components loss
train pp2_fsdp2 4 --parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 2 \
  --parallelism.pipeline_parallel_schedule 1F1B --training.local_batch_size 4 \
  --validation.local_batch_size 2
for name in pp2 pp2_zbv pp2_zbv_fused_loss pp2_fsdp2; do
  same_losses single "$name" loss
  same_losses single "$name" validation_loss
  same_params single "$name"
done
grep -q 'pipeline: Interleaved1F1B over pp 2, 4 stages placed loop-style' "$WORK/pp2.log" ||
  fail "pp2: pipeline layout line"
grep -q 'pipeline: ZBVZeroBubble over pp 2, 4 stages placed v-style' "$WORK/pp2_zbv.log" ||
  fail "pp2_zbv: pipeline layout line"
grep -q 'FSDP: sharded over 2 ranks .*reshard_after_forward never' "$WORK/pp2_fsdp2.log" ||
  fail "pp2_fsdp2: FSDP under PP keeps parameters between microbatches"

# --- Hugging Face export under PP: every stage's weights, equal to the same run's checkpoint ---
train pp2_hf 2 "${pp[@]}" --checkpoint.last_save_in_hf true --checkpoint.last_save_model_only true
"$TITAN" convert diff "$WORK/pp2_hf/checkpoint/step-10-hf" "$WORK/pp2/checkpoint/step-10" \
  >"$WORK/out" 2>&1 || { cat "$WORK/out" >&2; fail "PP HF export differs from its checkpoint"; }

# --- pp 2's step-5 checkpoint resumes in one process with the uninterrupted losses ---
resume_from pp2 5 resume_single 1 --training.local_batch_size 8 --validation.local_batch_size 4

# --- wrong combinations stop at start-up with the arithmetic (exit 2) ---
expect_exit 2 timeout 120 "$TITAN" run --nproc_per_node 2 -- train "${common[@]}" "${pp[@]}" \
  --training.local_batch_size 1 --parallelism.pipeline_parallel_schedule 1F1B \
  --job.dump_folder "$WORK/few"
expect_output "1F1B needs at least as many microbatches as stages: 1 microbatches < 2 stages"
expect_exit 2 timeout 120 "$TITAN" run --nproc_per_node 2 -- train "${common[@]}" "${pp[@]}" \
  --parallelism.pipeline_parallel_microbatch_size 3 \
  --job.dump_folder "$WORK/uneven"
expect_output "local_batch_size 8 is not a multiple of parallelism.pipeline_parallel_microbatch_size 3 \(8 % 3 = 2\)"

# --- a rank killed mid-schedule: the job ends non-zero, naming the rank ---
kill_rank_1_mid_run killed "${pp[@]}"
echo "ok"
