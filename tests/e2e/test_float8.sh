# Float8 linear layers from the command line, as TorchTitan spells them: the debug config trains
# a few steps with model.converters = quantize.linear.float8 emulated (any machine), logging the
# recipe and what it converted; on a device without float8 matmuls and without emulate the run
# stops at start-up (exit 2) with a HINT; an unknown converter name suggests the nearest. FSDP's
# float8 all-gather runs on 2 ranks and is refused with a non-tensorwise recipe.
source "$(dirname "$0")/lib.sh"

run=(train --job.config_file configs/llama3/debug_model.toml --training.steps 2
     --training.seq_len 64 --training.local_batch_size 2 --validation.enable false
     --metrics.log_freq 1 --metrics.disable_color_printing --training.num_threads 1)

expect_exit 0 "$TITAN" "${run[@]}" --job.dump_folder "$WORK/tensorwise" \
  --model.converters quantize.linear.float8 --quantize.linear.float8.emulate
expect_output "float8 linear layers \(tensorwise recipe, emulated in float32\): 42 converted, 1 kept"
expect_output "float8: filter_fqns keeps output"
expect_output "step: 2 .*loss: "

expect_exit 0 "$TITAN" "${run[@]}" --job.dump_folder "$WORK/rowwise" --model.converters float8 \
  --quantize.linear.float8.emulate --quantize.linear.float8.recipe_name rowwise \
  --quantize.linear.float8.filter_fqns auto_filter_small_kn
expect_output "float8 linear layers \(rowwise recipe, emulated in float32\): 0 converted, 43 kept"
expect_output "auto_filter_small_kn keeps"

# FSDP 2 gathering the float8 weights in float8 (bf16 params: the debug config's
# mixed_precision_param), scales precomputed; one process warns that there is nothing to gather.
f8ag=(--model.converters float8 --quantize.linear.float8.emulate
      --quantize.linear.float8.enable_fsdp_float8_all_gather
      --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp)
expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- "${run[@]}" \
  --job.dump_folder "$WORK/all_gather" --parallelism.data_parallel_shard_degree 2 "${f8ag[@]}"
expect_output "FSDP: sharded over 2 ranks .*param bf16.*float8 all-gather of 42 weights with precomputed scales"
expect_output "step: 2 .*loss: "
expect_exit 0 "$TITAN" "${run[@]}" --job.dump_folder "$WORK/all_gather_one" "${f8ag[@]}" \
  --training.steps 1
expect_output "enable_fsdp_float8_all_gather = true has no effect: parameters are not sharded"
expect_exit 2 "$TITAN" "${run[@]}" --job.dump_folder "$WORK/all_gather_rowwise" "${f8ag[@]}" \
  --quantize.linear.float8.recipe_name rowwise
expect_output "enable_fsdp_float8_all_gather = true needs the tensorwise recipe, but recipe_name = 'rowwise'"

expect_exit 2 "$TITAN" "${run[@]}" --job.dump_folder "$WORK/cpu" --training.device cpu \
  --model.converters float8
expect_output "has no float8 matmuls \(at::_scaled_mm needs a CUDA GPU of compute capability >= 8.9"
expect_output "HINT: set quantize.linear.float8.emulate = true"

expect_exit 2 "$TITAN" "${run[@]}" --job.dump_folder "$WORK/typo" --model.converters flaot8
expect_output "model.converters entry 'flaot8' is not a model converter; did you mean 'float8'\?"
echo "ok"
