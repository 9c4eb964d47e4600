# Bad configuration gives exit code 2 and a message that names the problem; --help lists every
# section; inspect prints the 8B parameter count without allocating it.
source "$(dirname "$0")/lib.sh"
cfg=configs/llama3/debug_model.toml

expect_exit 2 "$TITAN" train --job.config_file $cfg --training.stesp 5
expect_output "training.stesp"
expect_output "training.steps"

expect_exit 2 "$TITAN" train --job.config_file $cfg --trainig.steps 5
expect_output "did you mean 'training'"

expect_exit 2 "$TITAN" train --job.config_file $cfg --training.steps ten
expect_output "integer"

expect_exit 2 "$TITAN" train --job.config_file $cfg --training.global_batch_size 12
expect_output "multiple"

expect_exit 2 "$TITAN" train --job.config_file $cfg --model.flavor debugmodl
expect_output "debugmodel"

expect_exit 2 "$TITAN" train --job.config_file $cfg --parallelism.tensor_parallel_degree 2
expect_output "tp\(2\)"

expect_exit 2 "$TITAN" train --job.config_file "$WORK/missing.toml"
expect_output "missing.toml"

printf '[training]\nsteps = \n' > "$WORK/broken.toml"
expect_exit 2 "$TITAN" train --job.config_file "$WORK/broken.toml"
expect_output "broken.toml"

expect_exit 2 "$TITAN" frobnicate

# The subcommands' flag tables: an unknown action or flag names the nearest, a flag's value is
# required, positional arguments are counted, and --help lists every action's flags.
expect_exit 2 "$TITAN" convert to_hf a b
expect_output "unknown action 'to_hf'; did you mean 'to-hf'\?"
expect_output "titan convert --help. lists each action's flags"
expect_exit 2 "$TITAN" tokenizer encode --tokenizr x
expect_output "unknown argument '--tokenizr'; did you mean '--tokenizer'\?"
expect_exit 2 "$TITAN" data prepare --input a b --output
expect_output "--output needs a value \(DIR\)"
expect_exit 2 "$TITAN" fr analyze a b
expect_output "titan fr analyze takes DIR \(got 2 arguments\)"
expect_exit 2 "$TITAN" selftest --fail_rnk 1
expect_output "did you mean '--fail_rank'\?"
expect_exit 2 "$TITAN" plan --cpu=yes
expect_output "--cpu takes no value"
expect_exit 0 "$TITAN" data --help
expect_output "--shard-tokens N"

# training.device: a GPU asked for where none is visible (CI machines) is a config error, before
# anything is built; a bad value names the choices.
if [[ -z "${CUDA_VISIBLE_DEVICES:-}" ]] && ! command -v nvidia-smi >/dev/null; then
  expect_exit 2 "$TITAN" train --job.config_file $cfg --training.device cuda \
    --job.dump_folder "$WORK/device_cuda"
  expect_output 'training.device = "cuda" but no CUDA device is visible'
  expect_exit 2 "$TITAN" generate --flavor debugmodel --prompt hi --device cuda
  expect_output '[-][-]device = "cuda" but'
fi
expect_exit 2 "$TITAN" train --job.config_file $cfg --training.device gpu
expect_output "training.device"
expect_output "auto"

expect_exit 0 "$TITAN" train --help
for section in job metrics model optimizer lr_scheduler training parallelism validation debug; do
  expect_output "\[$section\]"
done
expect_output "--training.seq_len"

expect_exit 0 "$TITAN" inspect --job.config_file configs/llama3/llama3_8b.toml
expect_output "8,030,261,248 total"
expect_output "FLOPs per token"
expect_output "activations"

# The layout's per-rank memory: FSDP 8 x TP 8 shards the fp32 states 64 ways (1.87 GiB whole for
# 8B, so 0.467 GiB of weights per rank); WORLD_SIZE gives dp_shard -1 the rest of the world.
expect_exit 0 "$TITAN" inspect --job.config_file configs/llama3/llama3_8b.toml \
  --parallelism.data_parallel_shard_degree 8 --parallelism.tensor_parallel_degree 8
expect_output "world 64 = pp\(1\) x dp_replicate\(1\) x dp_shard\(8\) x cp\(1\) x tp\(8\)"
expect_output "weights \(fp32\) +0.467 GiB"
expect_exit 0 env WORLD_SIZE=16 "$TITAN" inspect --job.config_file configs/llama3/llama3_8b.toml \
  --parallelism.tensor_parallel_degree 2
expect_output "world 16 = pp\(1\) x dp_replicate\(1\) x dp_shard\(8\) x cp\(1\) x tp\(2\)"
# Activation checkpointing and full bf16 training are in the estimate.
expect_exit 0 "$TITAN" inspect --job.config_file configs/llama3/llama3_8b.toml \
  --activation_checkpoint.mode full --training.dtype bfloat16
expect_output "activations \(estimate, full AC\)"
expect_output "weights \(bf16\) +14.958 GiB"

expect_exit 0 "$TITAN" inspect --job.config_file configs/llama3/llama3_405b.toml --job.print_config
expect_output "flavor = \"405B\""
echo "ok"
