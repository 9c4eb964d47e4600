#!/usr/bin/env bash
# Hardening at the binary level (issue 12, items 5, 8, 11, 15, 16): inputs that are not regular
# files are refused at once in every format (no hang, no unbounded memory); text must be UTF-8
# and hold text in every format; a full disk under an output fails the command naming the file and
# the errno; generate checks the tokenizer against the model; SIGTERM logs the interrupted step and
# the last checkpoint; a resumed run's metrics.jsonl holds each step once after a resume marker,
# and a tokenizer other than the checkpoint's is warned about. About 15 s on 2 cores.
source "$(dirname "$0")/lib.sh"

args=(train --job.config_file configs/llama3/debug_model.toml --job.dump_folder "$WORK/run"
      --training.steps 2 --training.seq_len 32 --training.local_batch_size 2
      --validation.enable=false --metrics.peak_flops 1e12 --metrics.disable_color_printing)
not_regular="is a FIFO \(named pipe\), not a regular file"

# Item 8: FIFOs and devices, as a dataset in each format, validation data, a tokenizer, a config.
# `timeout` turns the old hang into a failure instead of a stuck test.
mkfifo "$WORK/fifo.jsonl"
for format in jsonl text tokens; do
  expect_exit 1 timeout 60 "$TITAN" "${args[@]}" --training.dataset "$format" \
    --training.dataset_path "$WORK/fifo.jsonl"
  expect_output "dataset file '$WORK/fifo.jsonl' $not_regular"
done
expect_exit 1 timeout 60 "$TITAN" "${args[@]}" --training.dataset jsonl --training.dataset_path /dev/zero
expect_output "'/dev/zero' is a character device, not a regular file"
expect_exit 1 timeout 60 "$TITAN" "${args[@]}" --validation.enable --validation.dataset jsonl \
  --validation.dataset_path "$WORK/fifo.jsonl"
expect_output "$not_regular"
expect_exit 1 timeout 60 "$TITAN" "${args[@]}" --model.hf_assets_path "$WORK/fifo.jsonl"
expect_output "tokenizer file '$WORK/fifo.jsonl' $not_regular"
expect_exit 1 timeout 60 "$TITAN" "${args[@]}" --model.hf_assets_path /dev/zero
expect_output "tokenizer file '/dev/zero' is a character device"
expect_exit 2 timeout 60 "$TITAN" train --job.config_file "$WORK/fifo.jsonl"
expect_output "config file '$WORK/fifo.jsonl' \(job.config_file\) $not_regular"

# Item 15: one rule for every text format: UTF-8 (file and byte offset named), and some text.
printf 'good text\nbad \xff byte\n' >"$WORK/bad.txt"
expect_exit 1 "$TITAN" "${args[@]}" --training.dataset text --training.dataset_path "$WORK/bad.txt"
expect_output "bad.txt: invalid UTF-8 at byte offset 14"
printf '{"text": ""}\n{"text": ""}\n' >"$WORK/empty.jsonl"
expect_exit 1 "$TITAN" "${args[@]}" --training.dataset jsonl --training.dataset_path "$WORK/empty.jsonl"
expect_output "empty.jsonl: every line's \"text\" is empty"

# Item 5: a full disk (/dev/full: ENOSPC on every write) under metrics.jsonl and under stdout.
mkdir -p "$WORK/full"
ln -s /dev/full "$WORK/full/metrics.jsonl"
expect_exit 1 "$TITAN" "${args[@]}" --job.dump_folder "$WORK/full"
expect_output "$WORK/full/metrics.jsonl: cannot write: No space left on device"
if grep -q "training done" "$WORK/out"; then fail "a run that lost its metrics claimed success"; fi
set +e
"$TITAN" generate --flavor tiny --prompt hi --max_new_tokens 2 >/dev/full 2>"$WORK/out"
rc=$?
set -e
[ "$rc" = 1 ] || { cat "$WORK/out" >&2; fail "generate into a full disk exited $rc"; }
expect_output "cannot write the output to standard output: No space left on device"
printf 'hello\n' >"$WORK/hello.txt"
set +e
"$TITAN" tokenizer encode --input "$WORK/hello.txt" --tokenizer assets/tokenizer/sotu_2k >/dev/full 2>"$WORK/out"
rc=$?
set -e
[ "$rc" = 1 ] || { cat "$WORK/out" >&2; fail "tokenizer encode into a full disk exited $rc"; }
expect_output "cannot write standard output: No space left on device"

# Item 11: a tokenizer larger than the model is refused up front, as train does.
expect_exit 2 "$TITAN" generate --flavor tiny --prompt hi --tokenizer assets/tokenizer/sotu_2k
expect_output "tokenizer vocab 2048 exceeds the model's vocab_size 300"

# Item 16: SIGTERM mid-run names the step and the last checkpoint; the process still dies by it.
sig=(train --job.config_file configs/llama3/debug_model.toml --job.dump_folder "$WORK/sig"
     --training.seq_len 64 --training.local_batch_size 4 --validation.enable=false
     --metrics.log_freq 1 --metrics.peak_flops 1e12 --metrics.disable_color_printing
     --checkpoint.enable --checkpoint.interval 5)
"$TITAN" "${sig[@]}" --training.steps 1000 >"$WORK/sig.log" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do
  grep -q '"step":6,' "$WORK/sig/metrics.jsonl" 2>/dev/null && break
  sleep 0.05
done
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 143 ] || { cat "$WORK/sig.log" >&2; fail "SIGTERM: exit $rc, expected 143"; }
last=$(ls -d "$WORK/sig/checkpoint"/step-* | sort -t- -k2 -n | tail -n 1)
saved=${last##*step-}
grep -qE "training interrupted by SIGTERM during step [0-9]+ of 1000; the last checkpoint is $last;" \
  "$WORK/sig.log" || { cat "$WORK/sig.log" >&2; fail "no interruption line naming $last"; }
logged=$(grep -c '"loss":' "$WORK/sig/metrics.jsonl")
[ "$logged" -gt "$saved" ] || fail "killed too late to test the resume ($logged rows, step-$saved)"

# The resume (with another tokenizer: the byte tokenizer) drops the rows past the checkpoint,
# writes a marker, and warns that the data position belongs to the checkpoint's tokenizer.
expect_exit 0 "$TITAN" "${sig[@]}" --training.steps $((saved + 2)) --model.hf_assets_path ""
expect_output "recorded with tokenizer './assets/tokenizer/sotu_2k' \(vocab 2048"
expect_output "this run uses the byte tokenizer"
metrics="$WORK/sig/metrics.jsonl"
grep -q "{\"dropped_rows\":$((logged - saved)),\"event\":\"resume\",\"step\":$saved}" "$metrics" ||
  { cat "$metrics" >&2; fail "no resume marker for step $saved"; }
steps=$(sed -nE 's/.*"step":([0-9]+).*/\1/p' <(grep '"loss":' "$metrics"))
[ "$(echo "$steps" | tr '\n' ' ')" = "$(seq 1 $((saved + 2)) | tr '\n' ' ')" ] ||
  fail "steps logged after the resume: $(echo "$steps" | tr '\n' ' ')"
echo "hardening (data, outputs, signals): ok"
