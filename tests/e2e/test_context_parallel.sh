# Context parallelism end to end, real processes over Gloo: 10 float32 steps of the narrow debug
# model (seq 64, global batch 8, validation every 5 steps) in one process, then cp 2 with ring
# (alltoall) attention and head-tail sharding, and dp_shard 2 x cp 2 with the all-gather rotation.
# Each gives the single-process training and validation losses within 1e-5 relative and final
# parameters within the data-parallel tests' tolerance; cp 2's step-5 checkpoint resumes in one
# process; a sequence length the chunks do not divide stops at start-up with the arithmetic.
# Block-causal attention (model.attn_mask_type) on a corpus of short documents: cp 2 (all-gather
# rotation) reproduces the single process's training and validation losses.
source "$(dirname "$0")/parallel_lib.sh"

train single 1 --training.local_batch_size 8 --validation.local_batch_size 4
train cp2 2 --parallelism.context_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 \
  --parallelism.context_parallel_rotate_method alltoall --training.local_batch_size 8 \
  --validation.local_batch_size 4
train fsdp2_cp2 4 --parallelism.context_parallel_degree 2 \
  --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 4 \
  --validation.local_batch_size 2
for name in cp2 fsdp2_cp2; do
  same_losses single "$name" loss
  same_losses single "$name" validation_loss
  same_params single "$name"
done
grep -q 'context parallelism: ring attention (alltoall) over cp 2, headtail' "$WORK/cp2.log" ||
  fail "cp2: context-parallel line"
grep -q 'FSDP: sharded over 4 ranks' "$WORK/fsdp2_cp2.log" || fail "fsdp2_cp2: FSDP over dp_shard x cp"

# Short documents (4 to 12 characters): every 64-token window packs several.
alphabet=abcdefghijklmnopqrstuvwxyz
for ((d = 0; d < 400; d++)); do
  printf '{"text": "%s %d"}\n' "${alphabet:$((d % 20)):$((2 + d % 7))}" "$d"
done >"$WORK/short.jsonl"
block=(--model.attn_mask_type block_causal --training.dataset jsonl
  --training.dataset_path "$WORK/short.jsonl" --validation.dataset jsonl
  --validation.dataset_path "$WORK/short.jsonl")
train block_single 1 "${block[@]}" --training.local_batch_size 8 --validation.local_batch_size 4
train block_cp2 2 "${block[@]}" --parallelism.context_parallel_degree 2 \
  --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8 \
  --validation.local_batch_size 4
same_losses block_single block_cp2 loss
same_losses block_single block_cp2 validation_loss
grep -q 'attention: block-causal, documents end at token' "$WORK/block_cp2.log" ||
  fail "block_cp2: block-causal line"

resume_from cp2 5 resume_single 1 --training.local_batch_size 8 --validation.local_batch_size 4

expect_exit 2 timeout 120 "$TITAN" run --nproc_per_node 2 -- train "${common[@]}" \
  --parallelism.context_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 \
  --training.local_batch_size 8 --training.seq_len 66 --validation.enable false \
  --job.dump_folder "$WORK/uneven"
expect_output "training.seq_len 66 must be divisible by 2 x cp x tp = 4 \(training.seq_len % 4 = 2\)"
echo "ok"
