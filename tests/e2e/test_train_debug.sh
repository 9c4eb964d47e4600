# The real binary trains the default debug config (with its trained 2,048-id tokenizer) for a few
# dozen steps and the loss falls; validation runs and lands in metrics.jsonl.
source "$(dirname "$0")/lib.sh"

expect_exit 0 "$TITAN" train --job.config_file configs/llama3/debug_model.toml \
  --job.dump_folder "$WORK/run" --training.steps 40 --training.seq_len 128 \
  --lr_scheduler.warmup_steps 5 --metrics.log_freq 5 --validation.freq 40 --validation.steps 4 \
  --metrics.disable_color_printing
expect_output "model parameters: "
# The config's tokenizer: the 2,048-id BPE trained on sotu by scripts/setup.sh, not the bytes.
expect_output "tokenizer vocab 2048"
expect_output "peak FLOP/s for MFU: .* measured"
# The paths chosen for this CPU, with why (bf16 matmuls by ATen or widened, by the GEMMs' measured
# rates; titan's kernels).
expect_output "CPU paths \(each measured fastest on this kind of CPU; same numbers\): bfloat16 matmuls"
expect_output "bfloat16 matmuls (by ATen|and attention in float32 on the rounded operands) \((bf16 GEMMs measured [0-9.]+ GFLOP/s per core on this CPU, float32 [0-9.]+|TITAN_CPU_FAST_BF16_MATMUL=[01])\)"
expect_output "step: 40 .*loss: .*grad_norm: .*lr: .*memory: .*GiB.*tps: .*tflops: .*mfu: .*%"
expect_output "validation_loss: "
metrics="$WORK/run/metrics.jsonl"
[ -f "$metrics" ] || fail "no metrics.jsonl"
first=$(json_field "$metrics" loss 1)
last=$(json_field "$metrics" loss -1)
vloss=$(json_field "$metrics" validation_loss -1)
echo "loss: first $first last $last; validation $vloss"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' ||
  fail "loss did not fall by > 1.0 nat: $first -> $last"
# A uniform guess over 2,048 ids scores ln 2048 = 7.62 nats; 40 short steps reach about 5.9.
awk -v v="$vloss" 'BEGIN { exit !(v > 0 && v < 6.6) }' || fail "validation loss $vloss out of range"
for key in step loss grad_norm lr tps tflops mfu memory_gib elapsed_s host_syncs \
  host_syncs_between_logs; do
  grep -q "\"$key\":" "$metrics" || fail "metrics.jsonl lacks $key"
done

# The TorchTitan-style launcher: CONFIG_FILE, NGPU and overrides pass through to the binary.
expect_exit 0 env TITAN="$TITAN" CONFIG_FILE=configs/llama3/debug_model.toml NGPU=1 \
  bash scripts/run_train.sh --job.dump_folder "$WORK/launcher" --training.steps 3 \
  --training.seq_len 64 --validation.enable=false --metrics.log_freq 1 --job.print_config
expect_output "seq_len = 64"
expect_output "step: 3 "
[ "$(grep -c '"loss":' "$WORK/launcher/metrics.jsonl")" = 3 ] || fail "launcher run logged != 3 steps"
# NGPU=2 goes through `titan run`: two ranks train with FSDP (the default dp_shard = -1).
expect_exit 0 env TITAN="$TITAN" NGPU=2 timeout 120 bash scripts/run_train.sh \
  --job.dump_folder "$WORK/launcher2" --training.steps 3 --training.seq_len 64 \
  --validation.enable=false --metrics.log_freq 1
expect_output "FSDP: sharded over 2 ranks"
expect_output "step: +3 "
[ "$(grep -c '"loss":' "$WORK/launcher2/metrics.jsonl")" = 3 ] || fail "NGPU=2 run logged != 3 steps"

# titan bench --breakdown with the fused kernels: the speed line, then phases and op families.
expect_exit 0 "$TITAN" bench --model.flavor tiny --model.hf_assets_path "" --training.seq_len 32 \
  --training.local_batch_size 2 --training.steps 2 --metrics.peak_flops 1e12 --breakdown \
  --compile.enable
expect_output "^bench model=llama3 flavor=tiny .*tokens_per_s="
expect_output "^breakdown of a step \(mean of 2\): [0-9.]+ ms with the op callback, [0-9.]+ ms without"
expect_output "^  backward +[0-9.]+ +[0-9.]+%"
expect_output "^  matmul +[0-9.]+ +[0-9.]+% +[0-9.]+ TFLOP/s = [0-9]+% of the GEMM probe"
expect_output "^  rope +[0-9.]+"
expect_output "CPU paths .*titan's RoPE kernel \(1 tables\); ATen's RMSNorm( and SwiGLU)? \(faster than titan's in bfloat16\).*compile.enable adds nothing to these"
if grep -q "CPU paths (.*): bfloat16 matmuls and attention in float32 on the rounded operands" "$WORK/out"; then
  # bf16 GEMMs measured slow here: the feed-forward keeps its float32 products.
  expect_output "CPU paths .*; ATen's RMSNorm \(faster than titan's in bfloat16\); titan's widened SwiGLU \(2, between float32 products\)"
fi
expect_output "loss: fused linear \+ cross-entropy \(compile.components loss\)"
expect_output "^  loss +[0-9.]+ +[0-9.]+%"
# The command table: usage lists every public command, an unknown one gets "did you mean".
expect_exit 0 "$TITAN" --help
expect_output "^  train     train a model"
expect_output "^  pipeline-schedule  print a pipeline schedule"
! grep -q selftest "$WORK/out" || fail "titan --help lists the hidden selftest command"
expect_exit 2 "$TITAN" trian --training.steps 1
expect_output "titan: unknown command 'trian'; did you mean 'train'\?"
expect_output "^  plot      draw runs' metrics"
echo "ok"
