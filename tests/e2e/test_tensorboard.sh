#!/usr/bin/env bash
# TensorBoard end to end: the tiny debug model trains with metrics.enable_tensorboard, one
# process (with validation) and 2 processes with metrics.save_for_all_ranks, and the `tensorboard`
# package (tests/e2e/tensorboard_check.py, run by $TITAN_PYTHON) reads the event files back:
# TorchTitan's layout (<dump_folder>/<save_tb_folder>/<YYYYmmdd-HHMM>/[rank_<r>/]), one event file
# per writing rank, and every scalar of every logged step and validation equal to metrics.jsonl.
# metrics.enable_wandb is refused, naming the key.
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh)\" bash $0 $TITAN"
CHECK="$(dirname "$0")/tensorboard_check.py"
export OMP_NUM_THREADS=2

run=(--job.config_file configs/llama3/debug_model.toml --model.flavor tiny --model.hf_assets_path ""
     --training.seq_len 32 --training.local_batch_size 2 --training.steps 5
     --metrics.log_freq 2 --metrics.peak_flops 1e12 --metrics.disable_color_printing
     --metrics.enable_tensorboard)

# The one folder a glob names (fails unless exactly one).
only() {
  [ "$#" = 1 ] && [ -d "$1" ] || fail "expected one folder, got: $*"
  echo "$1"
}

# One process: steps 1, 2, 4, 5 logged, validation at 2, 4 and 5.
expect_exit 0 "$TITAN" train "${run[@]}" --job.dump_folder "$WORK/one" \
  --validation.enable --validation.freq 2 --validation.steps 2 --validation.seq_len 32 \
  --validation.local_batch_size 2
expect_output "TensorBoard logging enabled; event file $WORK/one/tb/[0-9]{8}-[0-9]{4}/events\.out\.tfevents\.[0-9]{10}\."
[ "$(grep -c '"validation_loss":' "$WORK/one/metrics.jsonl")" = 3 ] || fail "not 3 validations"
tb="$(only "$WORK"/one/tb/*)"
"$PY" "$CHECK" "$WORK/one/metrics.jsonl" "$tb" || fail "one process: TensorBoard != metrics.jsonl"

# Two processes, each rank its own file under <timestamp>/rank_<r>/ of one timestamp folder.
expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- train "${run[@]}" \
  --validation.enable false --job.dump_folder "$WORK/two" --metrics.save_for_all_ranks \
  --metrics.save_tb_folder runs
stamp="$(only "$WORK"/two/runs/*)"
for rank in 0 1; do
  "$PY" "$CHECK" "$WORK/two/metrics_rank_$rank.jsonl" "$(only "$stamp/rank_$rank")" ||
    fail "rank $rank: TensorBoard != metrics_rank_$rank.jsonl"
done
[ "$(ls "$stamp")" = "$(printf 'rank_0\nrank_1')" ] || fail "$stamp holds $(ls "$stamp")"

expect_exit 2 "$TITAN" inspect --metrics.enable_wandb
expect_output "config key 'metrics.enable_wandb' = true is not supported yet: Weights & Biases"
echo "ok"
