# `titan plan` ranks layouts for a cluster: its per-device memory is what `titan inspect` prints
# for the same layout (one estimate, so the two never disagree), dense and pipelined; the
# config's own layout is placed among them; --cpu measures this machine; bad flags exit 2 naming
# the flag.
source "$(dirname "$0")/lib.sh"

expect_exit 0 "$TITAN" plan --help
expect_output "usage: titan plan"

# Llama 3.1 8B on one node of 8 H100 (TorchTitan's benchmark: global batch 16).
expect_exit 0 "$TITAN" plan --job.config_file configs/llama3/llama3_8b.toml \
  --training.global_batch_size 16 --gpu h100 --gpus_per_node 8 --top 3
expect_output "^searched [0-9,]+ layouts: [0-9,]+ valid and fitting; rejected: .*does not fit: [0-9,]+"
expect_output "^#1 "
expect_output "^#3 "
expect_output "tokens/s per device [0-9,]+, MFU [0-9.]+%"
expect_output "^the config's layout, rank [0-9]+ of [0-9]+: dp_shard 8, AC op"
cp "$WORK/out" "$WORK/plan8b"

# plan_agrees_with_inspect WORLD ARGS...: #1's memory equals inspect's total for the job ARGS
# with #1's overrides.
plan_agrees_with_inspect() {
  local world="$1"
  shift
  local overrides plan_gib inspect_gib
  overrides=$(sed -n 's/^   config: //p' "$WORK/out" | head -n 1)
  plan_gib=$(sed -nE 's/^   memory per device ([0-9.]+) GiB.*/\1/p' "$WORK/out" | head -n 1)
  [ -n "$overrides" ] && [ -n "$plan_gib" ] || { cat "$WORK/out" >&2; fail "no #1 layout"; }
  # shellcheck disable=SC2086
  expect_exit 0 env WORLD_SIZE="$world" "$TITAN" inspect "$@" $overrides
  inspect_gib=$(sed -nE 's/^  total +([0-9.]+) GiB.*/\1/p' "$WORK/out")
  [ "$plan_gib" = "$inspect_gib" ] || fail "plan says $plan_gib GiB, inspect $inspect_gib GiB ($overrides)"
  echo "plan and inspect agree: $plan_gib GiB ($overrides)"
}
cp "$WORK/plan8b" "$WORK/out"
plan_agrees_with_inspect 8 --job.config_file configs/llama3/llama3_8b.toml

# A pipeline (its stages hold the schedule's microbatches in flight and keep their weights
# gathered between them) and 4 nodes.
expect_exit 0 "$TITAN" plan --job.config_file configs/llama3/llama3_70b.toml \
  --training.global_batch_size 64 --nodes 4 --parallelism.pipeline_parallel_degree 4 \
  --parallelism.pipeline_parallel_schedule Interleaved1F1B --top 1
expect_output "^#1 .*pp 4 Interleaved1F1B"
expect_output "bubble [0-9.e-]+ \([0-9.]+% of the pipeline\)"
expect_output "pp [0-9.e+]+ GB in [0-9.e+]+ ops inter-node"
plan_agrees_with_inspect 32 --job.config_file configs/llama3/llama3_70b.toml

# MoE: expert parallelism is searched.
expect_exit 0 "$TITAN" plan --model.name qwen3 --model.flavor debugmodel_moe \
  --training.seq_len 256 --training.global_batch_size 8 --gpus_per_node 8 \
  --parallelism.expert_parallel_degree 8 --top 1
expect_output "^#1 .*ep 8"
expect_output "ep [0-9.e+-]+ GB in [0-9.e+]+ ops intra-node"

# MoE under TP: whole experts on every tp rank (etp 1: FSDP's share of them, their gradients
# all-reduced over tp) or each split over tp (etp 2); inspect agrees with both.
moe=(--model.name qwen3 --model.flavor debugmodel_moe --training.seq_len 256 --training.local_batch_size 2)
for etp in 1 2; do
  expect_exit 0 "$TITAN" plan "${moe[@]}" --training.global_batch_size 8 --gpus_per_node 8 \
    --parallelism.data_parallel_shard_degree 4 --parallelism.tensor_parallel_degree 2 \
    --parallelism.expert_parallel_degree 1 --parallelism.expert_tensor_parallel_degree $etp --top 1
  if [ $etp = 1 ]; then
    expect_output "^#1 dp_shard 4, tp 2, AC"
    expect_output "tp grads [0-9.e+-]+ GB in 1 ops intra-node"
    whole_gib=$(sed -nE 's/^   memory per device ([0-9.]+) GiB.*/\1/p' "$WORK/out")
  else
    expect_output "^#1 dp_shard 4, tp 2, experts split over tp, AC"
    ! grep -q "tp grads" "$WORK/out" || fail "split experts need no all-reduce of their gradients over tp"
    split_gib=$(sed -nE 's/^   memory per device ([0-9.]+) GiB.*/\1/p' "$WORK/out")
  fi
  plan_agrees_with_inspect 8 "${moe[@]}"
done
awk -v w="$whole_gib" -v s="$split_gib" 'BEGIN { exit !(w > 1.3 * s) }' ||
  fail "whole experts on every tp rank ($whole_gib GiB) should need more than split ones ($split_gib GiB)"

# Nothing fits: 405B on one GPU.
expect_exit 0 "$TITAN" plan --model.flavor 405B --training.seq_len 8192 \
  --training.global_batch_size 1 --training.local_batch_size 1 --gpus_per_node 1
expect_output "no layout fits"
expect_output "the config's layout does not fit"

# This machine: measured peak and loopback bandwidth, the e2e tests' debug model layouts.
expect_exit 0 "$TITAN" plan --cpu --job.config_file configs/llama3/debug_model.toml \
  --training.seq_len 64 --training.global_batch_size 8 --gpus_per_node 2 \
  --parallelism.tensor_parallel_degree 2 --top 1
expect_output "this CPU \(1/2 of it per rank\)"
expect_output "no communication overlaps compute"
expect_output "^#1 tp 2"
expect_exit 0 "$TITAN" plan --cpu --model.flavor debugmodel --training.seq_len 64 \
  --training.global_batch_size 8 --gpus_per_node 2 --peak_tflops 0.1 --intra_node_gbps 1 --top 1
expect_output "0.1 TFLOP/s peak at MFU 40%, 1 GB/s in a node, 1 GB/s across nodes"

# Bad flags name themselves.
expect_exit 2 "$TITAN" plan --nodes 0
expect_output "--nodes expects a positive integer, got '0'"
expect_exit 2 "$TITAN" plan --gpu h1000
expect_output "--gpu 'h1000' is not a GPU preset; did you mean 'h100'"
expect_exit 2 "$TITAN" plan --mfu 1.5
expect_output "--mfu is the compute efficiency"
expect_exit 2 "$TITAN" plan --node 2
expect_output "unknown argument '--node'; did you mean '--nodes'"
expect_exit 2 "$TITAN" plan --ac sometimes
expect_output "--ac 'sometimes'"
expect_exit 2 "$TITAN" plan --training.seq_lenn 8
expect_output "training.seq_lenn"
expect_exit 2 "$TITAN" plan --cpu --gpu h100
expect_output "--cpu and --gpu"
# (issue 37) Sizes that cannot finish are refused with the limit; usable memory cannot go negative.
expect_exit 2 timeout 20 "$TITAN" plan --nodes 1000000000
expect_output "--nodes 1000000000 x --gpus_per_node 8 = 8e\+09 devices: titan plan plans at most 1048576"
expect_exit 2 "$TITAN" plan --reserved_gib 1000
expect_output "--reserved_gib 1000 must be >= 0 and below the device memory, 80 GiB"
# A real user plans 4,096 nodes: the largest model on 4,096 x 8 H100 finishes (about 25 s here).
start=$SECONDS
expect_exit 0 timeout 300 "$TITAN" plan --nodes 4096 --model.name deepseek_v3 --model.flavor 671B --top 1
expect_output "^searched [0-9,]+ layouts: [0-9,]+ valid and fitting"
expect_output "^#1 "
echo "plan of deepseek_v3 671B on 4096 x 8 devices: $((SECONDS - start)) s"
echo "ok"
