#!/usr/bin/env bash
# Checkpoint folders that must not lose work: a model-only final export neither pushes out the
# last full checkpoint (keep_latest_k) nor is overwritten when training goes on; a folder of
# exports only, or load_step on an export, is refused instead of a silent fresh start; an edited
# index is detected and skipped; a second run on a dump folder in use is refused, naming the
# holder, and kill -9 frees the folder.
source "$(dirname "$0")/lib.sh"

base=(train --job.config_file configs/llama3/debug_model.toml --training.seq_len 32
  --training.local_batch_size 2 --validation.enable=false --metrics.log_freq 1
  --metrics.peak_flops 1e12 --metrics.disable_color_printing --checkpoint.enable)

# 1. The issue's sequence: interval 1, keep_latest_k 1, 3 steps, then 5.
k1=("${base[@]}" --job.dump_folder "$WORK/k1" --checkpoint.interval 1 --checkpoint.keep_latest_k 1)
expect_exit 0 "$TITAN" "${k1[@]}" --training.steps 3
[ -f "$WORK/k1/checkpoint/step-2/index.json" ] || fail "keep_latest_k deleted the newest full checkpoint: $(ls "$WORK/k1/checkpoint")"
expect_exit 0 "$TITAN" "${k1[@]}" --training.steps 5
expect_output "resuming training after step 2"
expect_output "step: +5 "
compgen -G "$WORK/k1/checkpoint/step-3.model-only-*" >/dev/null ||
  fail "the first run's final export was not kept: $(ls "$WORK/k1/checkpoint")"
echo "keep_latest_k 1: resumed after step 2; kept: $(ls "$WORK/k1/checkpoint" | tr '\n' ' ')"

# 2. Defaults: only the final model-only checkpoint exists; more steps must not start over.
defaults=("${base[@]}" --job.dump_folder "$WORK/only")
expect_exit 0 "$TITAN" "${defaults[@]}" --training.steps 2
expect_exit 2 "$TITAN" "${defaults[@]}" --training.steps 4
expect_output "only model-only checkpoints \(step-2"
expect_exit 2 "$TITAN" "${defaults[@]}" --training.steps 4 --checkpoint.load_step 2
expect_output "is a model-only checkpoint"
[ "$(ls "$WORK/only/checkpoint")" = "step-2" ] || fail "refused runs changed the folder: $(ls "$WORK/only/checkpoint")"

# 3. One changed digit in an index (train_state step 2 -> 1): detected, previous one used.
edit=("${base[@]}" --job.dump_folder "$WORK/edit" --checkpoint.interval 1 --checkpoint.last_save_model_only false)
expect_exit 0 "$TITAN" "${edit[@]}" --training.steps 2
sed -i -E '/"train_state"/,/\}/ s/"step": 2/"step": 1/' "$WORK/edit/checkpoint/step-2/index.json"
grep -q '"step": 1' "$WORK/edit/checkpoint/step-2/index.json" || fail "the edit did not apply"
expect_exit 0 "$TITAN" "${edit[@]}" --training.steps 3
expect_output "index is corrupted"
expect_output "resuming training after step 1"
compgen -G "$WORK/edit/checkpoint/step-2.unloadable-*" >/dev/null || fail "the edited step-2 was not kept aside"

# 4. Two runs on one dump folder.
long=("${base[@]}" --job.dump_folder "$WORK/busy" --training.steps 100000 --checkpoint.interval 1000000)
"$TITAN" "${long[@]}" >"$WORK/long.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  grep -q "step: " "$WORK/long.log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$WORK/long.log" >&2; fail "the first run died"; }
  sleep 0.1
done
expect_exit 2 "$TITAN" "${base[@]}" --job.dump_folder "$WORK/busy" --training.steps 1
expect_output "job.dump_folder '$WORK/busy' is in use by another run \(pid $pid on host"
kill -0 "$pid" 2>/dev/null || fail "the refused run disturbed the first one"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
expect_exit 0 "$TITAN" "${base[@]}" --job.dump_folder "$WORK/busy" --training.steps 1
echo "second run refused while pid $pid held the folder; free again after kill -9"
