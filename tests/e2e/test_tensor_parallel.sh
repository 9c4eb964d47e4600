# Tensor + sequence parallelism end to end, on CPU over Gloo: the narrow debug model (16 heads,
# vocab 2048) trained 10 float32 steps (seq 64, global batch 8) in one process and with TP 2, TP 4,
# TP 2 without loss parallel, FSDP 2 x TP 2, HSDP 2 x 2 x TP 2 (8 processes) and FSDP 2 x TP 2 with
# the fused linear + cross-entropy over vocabulary shards (compile.components loss). Every layout
# must give the single-process loss curves within 1e-5 relative and final parameters within 3e-4
# (see test_data_parallel.sh for why Adam needs the absolute bound). Checkpoints cross-load: TP 2's
# step 5 resumes under FSDP 4 and one process, FSDP 4's under TP 2 and FSDP 2 x TP 2; Hugging Face
# export / import work on TP shards; splits that do not divide are refused.
source "$(dirname "$0")/parallel_lib.sh"

train single 1 --training.local_batch_size 8 --validation.local_batch_size 4
declare -A layouts=(
  [tp2]="2 --training.local_batch_size 8 --validation.local_batch_size 4 --parallelism.tensor_parallel_degree 2"
  [tp4]="4 --training.local_batch_size 8 --validation.local_batch_size 4 --parallelism.tensor_parallel_degree 4"
  [tp2_gathered_loss]="2 --training.local_batch_size 8 --validation.local_batch_size 4 --parallelism.tensor_parallel_degree 2 --parallelism.disable_loss_parallel true"
  [fsdp2_tp2]="4 --training.local_batch_size 4 --validation.local_batch_size 2 --parallelism.tensor_parallel_degree 2"
  [hsdp2x2_tp2]="8 --training.local_batch_size 2 --validation.local_batch_size 1 --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_replicate_degree 2"
  [fsdp4]="4 --training.local_batch_size 2 --validation.local_batch_size 1"
  [fsdp2_tp2_fused_loss]="4 --training.local_batch_size 4 --validation.local_batch_size 2 --parallelism.tensor_parallel_degree 2 --compile.enable true --compile.components loss"
)
for name in tp2 tp4 tp2_gathered_loss fsdp2_tp2 hsdp2x2_tp2 fsdp2_tp2_fused_loss; do
  # shellcheck disable=SC2086
  train "$name" ${layouts[$name]}
  same_losses single "$name" loss
  same_losses single "$name" validation_loss
  same_params single "$name"
done
grep -q 'tensor parallel over 4 ranks (sequence parallel, 44 of 57 parameters sharded, 452.2K of 1.80M parameter elements per rank, loss parallel on)' \
  "$WORK/tp4.log" || fail "tp4 plan"
grep -q 'loss parallel off' "$WORK/tp2_gathered_loss.log" || fail "disable_loss_parallel"
grep -q 'loss: fused linear + cross-entropy' "$WORK/fsdp2_tp2_fused_loss.log" || fail "fused loss line"
grep -q 'world 8 = pp(1) x dp_replicate(2) x dp_shard(2) x cp(1) x tp(2)' "$WORK/hsdp2x2_tp2.log" ||
  fail "hsdp2x2_tp2 mesh"

# --- checkpoints across layouts ---
# shellcheck disable=SC2086
train fsdp4 ${layouts[fsdp4]}
for name in fsdp4 single; do
  args=${layouts[$name]:-"1 --training.local_batch_size 8 --validation.local_batch_size 4"}
  # shellcheck disable=SC2086
  resume_from tp2 5 "tp2_to_$name" $args
done
for name in tp2 fsdp2_tp2; do
  # shellcheck disable=SC2086
  resume_from fsdp4 5 "fsdp4_to_$name" ${layouts[$name]}
done

# --- Hugging Face export gathers the shards (bit for bit), import slices them ---
# shellcheck disable=SC2086
train tp2_hf ${layouts[tp2]} --checkpoint.last_save_in_hf true --checkpoint.last_save_model_only true
"$TITAN" convert diff "$WORK/tp2_hf/checkpoint/step-10-hf" "$WORK/tp2/checkpoint/step-10" \
  >"$WORK/out" 2>&1 || { cat "$WORK/out" >&2; fail "TP HF export differs from its checkpoint"; }
for name in single tp2; do
  n=$([ $name = single ] && echo 1 || echo 2)
  extra=(); [ $name = tp2 ] && extra=(--parallelism.tensor_parallel_degree 2)
  train "hf_$name" "$n" --training.local_batch_size 8 --validation.enable false --training.steps 1 \
    --checkpoint.initial_load_path "$WORK/tp2_hf/checkpoint/step-10-hf" \
    --checkpoint.initial_load_in_hf true "${extra[@]}"
done
same_losses hf_single hf_tp2 loss

# --- splits that do not divide are refused on every rank, with the numbers ---
expect_exit 2 timeout 60 "$TITAN" run --nproc_per_node 3 -- train "${common[@]}" \
  --parallelism.tensor_parallel_degree 3 --job.dump_folder "$WORK/bad"
expect_output 'config error: training.seq_len 64 must be divisible by parallelism.tensor_parallel_degree 3'
expect_exit 2 timeout 60 "$TITAN" run --nproc_per_node 3 -- train "${common[@]}" \
  --parallelism.tensor_parallel_degree 3 --training.seq_len 63 --validation.seq_len 63 \
  --job.dump_folder "$WORK/bad"
expect_output 'tok_embeddings.weight has 2048 vocabulary rows, not divisible by tensor_parallel_degree 3'
echo "tensor parallel: all layouts reproduce one process"
