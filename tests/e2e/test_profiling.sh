#!/usr/bin/env bash
# Profiler traces and memory timelines end to end ([profiling], TorchTitan's keys and file names):
# FSDP over 2 processes writes, per rank and window (profile_freq 2, one warm-up step, one
# recorded), a Chrome trace with the recorded step, ATen ops and our spans (data, forward,
# backward, optimizer, each collective's issue and wait named with its group), and a memory
# timeline whose phases add up; pipeline stages name their forwards and backwards; a CPU run
# limited below its own peak (TITAN_CPU_MEMORY_LIMIT) fails with a clear error and leaves the
# timeline of the failing step in iteration_<N>_exit; a schedule that does not fit is refused.
# tests/e2e/profiling_check.py (run by $TITAN_PYTHON) reads the files.
source "$(dirname "$0")/lib.sh"
# bf16 matmuls widened to float32 in every run, as on a CPU with slow bf16 GEMMs: the runs below
# then skip the start-up measurement of the GEMMs (3 MiB of tensors, above the memory limit of the
# out-of-memory case) and take one path on every CPU, fast everywhere.
export TITAN_CPU_FAST_BF16_MATMUL=0
PY="${TITAN_PYTHON:-python3}"
CHECK="$(dirname "$0")/profiling_check.py"

run=(--job.config_file configs/llama3/debug_model.toml --model.flavor tiny --model.hf_assets_path ""
     --training.seq_len 32 --training.local_batch_size 2 --validation.enable false
     --metrics.log_freq 1 --metrics.peak_flops 1e12 --metrics.disable_color_printing
     --profiling.profile_freq 2 --profiling.profiler_warmup 1 --profiling.profiler_active 1
     --profiling.save_traces_folder profile_traces)

# FSDP 2: traces and timelines at steps 2 and 4 on both ranks.
expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- train "${run[@]}" \
  --training.steps 4 --parallelism.data_parallel_shard_degree 2 --job.dump_folder "$WORK/fsdp" \
  --profiling.enable_profiling --profiling.enable_memory_snapshot
expect_output "profiling: step 4 trace written to $WORK/fsdp/profile_traces/iteration_4/rank0_trace.json"
"$PY" "$CHECK" "$WORK/fsdp" 2 2,4 --memory --traces data forward backward optimizer \
  "all_gather_into_tensor *" "reduce_scatter_tensor *" "wait all_gather_into_tensor*" \
  "wait reduce_scatter_tensor*" || fail "FSDP 2: profiler or memory files wrong"

# Pipeline 2 stages: each rank's forwards and backwards are spans named by their action, the
# activations move in send/recv spans.
expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- train "${run[@]}" \
  --training.steps 2 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_microbatch_size 1 --job.dump_folder "$WORK/pp" \
  --profiling.enable_profiling
"$PY" "$CHECK" "$WORK/pp" 2 2 --traces "forward *" "backward *" "send *" "recv *" optimizer ||
  fail "PP 2: trace spans wrong"

# Out of memory: a one-process baseline, then the same run limited halfway between the bytes held
# when step 1 starts and step 1's peak.
expect_exit 0 "$TITAN" train "${run[@]}" --training.steps 2 --job.dump_folder "$WORK/base" \
  --profiling.enable_memory_snapshot
"$PY" "$CHECK" "$WORK/base" 1 2 --memory || fail "one process: memory timeline wrong"
limit="$("$PY" -c 'import json, sys
s = json.load(open(sys.argv[1]))["steps"][0]
print((s["start_bytes"] + s["peak_bytes"]) // 2)' \
  "$WORK/base/memory_snapshot/iteration_2/rank0_memory_timeline.json")"
expect_exit 1 env TITAN_CPU_MEMORY_LIMIT="$limit" "$TITAN" train "${run[@]}" --training.steps 2 \
  --job.dump_folder "$WORK/oom" --profiling.enable_memory_snapshot
expect_output "CPU out of memory: tried to allocate [0-9]+ bytes"
expect_output "memory snapshot: step 1 \(after the error\) written to $WORK/oom/memory_snapshot/iteration_1_exit"
"$PY" -c 'import json, sys
t = json.load(open(sys.argv[1]))
assert [s["step"] for s in t["steps"]] == [1], t["steps"]
assert t["steps"][0]["peak_bytes"] <= int(sys.argv[2]), "peak above the limit"' \
  "$WORK/oom/memory_snapshot/iteration_1_exit/rank0_memory_timeline.json" "$limit" ||
  fail "the exit timeline does not hold step 1 under the limit"

# A window that cannot hold its warm-up and recorded steps: the arithmetic, exit 2.
expect_exit 2 "$TITAN" train "${run[@]}" --training.steps 2 --job.dump_folder "$WORK/bad" \
  --profiling.enable_profiling --profiling.profiler_warmup 2
expect_output "profiler_warmup\(2\) \+ profiler_active\(1\) = 3 > profile_freq\(2\)"
echo "ok"
