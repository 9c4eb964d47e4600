#!/usr/bin/env bash
# Loss-free resume: the trainer is killed with SIGKILL twice — once while a checkpoint is being
# written, once at a random moment — and each time the same command is run again. Every step's
# loss in the interrupted run (steps re-run after a kill included) must be bit-identical to an
# uninterrupted run with the same seed. Also: the unfinished save is cleaned up, a finished run
# is not retrained, and a corrupted newest checkpoint falls back to the previous one.
source "$(dirname "$0")/lib.sh"

steps=24
args=(train --job.config_file configs/llama3/debug_model.toml --training.steps "$steps"
  --training.seq_len 64 --training.local_batch_size 4 --validation.enable=false
  --metrics.log_freq 1 --metrics.peak_flops 1e12 --metrics.disable_color_printing
  --lr_scheduler.warmup_steps 4)

# Reference: no checkpoints, no interruptions.
expect_exit 0 "$TITAN" "${args[@]}" --job.dump_folder "$WORK/ref"
ckpt_args=(--job.dump_folder "$WORK/run" --checkpoint.enable --checkpoint.interval 4
  --checkpoint.keep_latest_k 3 --checkpoint.last_save_model_only false)
folder="$WORK/run/checkpoint"

# Kill 1: during a save (an unfinished step-N.tmp-* directory exists).
"$TITAN" "${args[@]}" "${ckpt_args[@]}" >"$WORK/kill1.log" 2>&1 &
pid=$!
for _ in $(seq 1 3000); do
  if compgen -G "$folder/step-*.tmp-*" >/dev/null; then break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.005
done
compgen -G "$folder/step-*.tmp-*" >/dev/null || fail "never caught a save in progress"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
echo "killed during save: $(ls "$folder" | tr '\n' ' ')"

# Kill 2: at a random moment of the resumed run.
"$TITAN" "${args[@]}" "${ckpt_args[@]}" >"$WORK/kill2.log" 2>&1 &
pid=$!
sleep "0.$((RANDOM % 9 + 1))"
sleep 1
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
echo "killed at random: $(ls "$folder" | tr '\n' ' ')"

# Run to completion.
expect_exit 0 "$TITAN" "${args[@]}" "${ckpt_args[@]}"
grep -q "a previous run stopped while saving" "$WORK/kill2.log" "$WORK/out" ||
  fail "the unfinished save of kill 1 was not cleaned up"
expect_output "step: +$steps "

# Every logged step (including steps logged twice around a kill) has the reference loss, bitwise.
extract() { sed -nE 's/.*"loss":([^,}]+).*"step":([0-9]+).*/\2 \1/p; s/.*"step":([0-9]+).*"loss":([^,}]+).*/\1 \2/p' "$1" | sort -u; }
extract "$WORK/ref/metrics.jsonl" >"$WORK/ref.losses"
extract "$WORK/run/metrics.jsonl" >"$WORK/run.losses"
[ "$(wc -l <"$WORK/ref.losses")" = "$steps" ] || fail "reference logged $(wc -l <"$WORK/ref.losses") steps"
# Each step of the run appears once (same loss on re-runs) and equals the reference.
cut -d' ' -f1 "$WORK/run.losses" | sort | uniq -d >"$WORK/dups"
[ ! -s "$WORK/dups" ] || fail "steps with two different losses across resumes: $(cat "$WORK/dups")"
diff <(sort -n "$WORK/ref.losses") <(sort -n "$WORK/run.losses") ||
  fail "resumed losses differ from the uninterrupted run"
echo "all $steps losses bit-identical to the uninterrupted run"

# Finished: running again trains nothing.
expect_exit 0 "$TITAN" "${args[@]}" "${ckpt_args[@]}"
if grep -q "step: " "$WORK/out"; then fail "a finished run trained again"; fi

# Corrupt the newest checkpoint: resuming with more steps falls back to the previous one.
newest=$(ls -d "$folder"/step-* | sort -t- -k2 -n | tail -n 1)
shard="$newest/shard-00000.safetensors"
printf '\x00\x01\x02\x03' | dd of="$shard" bs=1 seek=1000000 conv=notrunc status=none
expect_exit 0 "$TITAN" "${args[@]}" "${ckpt_args[@]}" --training.steps $((steps + 2))
expect_output "shard-00000.safetensors' is corrupted"
expect_output "falling back to the previous checkpoint"
echo "checkpoint kill/resume: ok"
