# `titan generate` end to end: usage errors exit 2; a debug model trained for a few steps with
# checkpointing generates from its checkpoint folder; greedy ids with and without the KV cache
# are identical; sampling repeats per seed and changes with it; --max_seq_len stops with a note;
# text streams to stdout with tokens/s on stderr; a Hugging Face export generates the same ids.
source "$(dirname "$0")/lib.sh"

# gen NAME ARGS...: runs generate, stdout to $WORK/NAME.out and stderr to $WORK/NAME.err.
gen() {
  local name="$1"; shift
  "$TITAN" generate "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" ||
    { cat "$WORK/$name.err" >&2; fail "generate $name exited $?"; }
}
# same A B: the two runs printed the same stdout.
same() {
  cmp -s "$WORK/$1.out" "$WORK/$2.out" ||
    fail "$1 and $2 differ: $(cat "$WORK/$1.out") vs $(cat "$WORK/$2.out")"
}

# Usage errors: exit 2, naming the argument.
expect_exit 0 "$TITAN" generate --help
expect_output "--prompt_ids"
expect_exit 2 "$TITAN" generate --prompt hi
expect_output "--checkpoint is required"
expect_exit 2 "$TITAN" generate --checkpoint "$WORK/no_such_dir" --prompt hi
expect_output "--checkpoint .*no_such_dir: no such file or directory"
expect_exit 2 "$TITAN" generate --flavor tiny --prompt hi --temperature warm
expect_output "--temperature expects a number, got 'warm'"
expect_exit 2 "$TITAN" generate --flavor tiny --prompt hi --top_p 1.5
expect_output "--top_p must be in \(0, 1\]"
expect_exit 2 "$TITAN" generate --flavor tiny --prompt hi --prompt_ids "1 2"
expect_output "exactly one of --prompt and --prompt_ids"
expect_exit 2 "$TITAN" generate --flavor tiny --prompt_ids "1 x"
expect_output "--prompt_ids expects an integer, got 'x'"
expect_exit 2 "$TITAN" generate --flavor tiny --prompt hi --bogus 3
expect_output "unknown argument '--bogus'"
expect_exit 2 "$TITAN" generate --flavor tiny --prompt hi --dtype float64
expect_output "--dtype must be float32 or bfloat16"
expect_exit 2 "$TITAN" generate --flavor nosuch --prompt hi
expect_output "nosuch"

# Train the narrow debug model briefly with a checkpoint at the end.
expect_exit 0 "$TITAN" train --job.config_file configs/llama3/debug_model.toml \
  --model.flavor debugmodel_narrow \
  --job.dump_folder "$WORK/run" --training.steps 30 --training.seq_len 128 \
  --lr_scheduler.warmup_steps 5 --validation.enable=false --metrics.log_freq 10 \
  --metrics.disable_color_printing --checkpoint.enable --checkpoint.interval 30
CKPT="$WORK/run/checkpoint"
[ -d "$CKPT" ] || fail "training wrote no checkpoint folder at $CKPT"

# Greedy: identical ids with and without the KV cache.
gen greedy --checkpoint "$CKPT" --prompt "The State of the Union" --temperature 0 \
  --max_new_tokens 40 --print_ids
gen greedy_nocache --checkpoint "$CKPT" --prompt "The State of the Union" --temperature 0 \
  --max_new_tokens 40 --print_ids --no_kv_cache
same greedy greedy_nocache
grep -q "KV cache off" "$WORK/greedy_nocache.err" || fail "--no_kv_cache did not turn the cache off"
# --max_new_tokens 0 prints just the prompt's ids (BOS first; the tokenizer is the checkpoint's).
gen prompt_only --checkpoint "$CKPT" --prompt "The State of the Union" --max_new_tokens 0 \
  --print_ids
n_prompt=$(wc -w <"$WORK/prompt_only.out")
[ "$n_prompt" -ge 2 ] || fail "the prompt encoded to $n_prompt ids"
# The prompt, then up to 40 new tokens (fewer if EOS came first), all on one line.
n=$(wc -w <"$WORK/greedy.out")
[ "$n" -gt "$n_prompt" ] && [ "$n" -le $((n_prompt + 40)) ] || fail "greedy printed $n ids"
[ "$(wc -l <"$WORK/greedy.out")" = 1 ] || fail "--print_ids printed more than one line"
[ "$(cut -d' ' -f1-"$n_prompt" "$WORK/greedy.out")" = "$(cat "$WORK/prompt_only.out")" ] ||
  fail "the sequence does not start with the prompt's ids"

# --prompt_ids continues exactly the given ids: feeding greedy's prompt gives greedy's ids.
prompt_ids=$(cat "$WORK/prompt_only.out")
gen greedy_ids --checkpoint "$CKPT" --prompt_ids "$prompt_ids" --temperature 0 \
  --max_new_tokens 40 --print_ids
same greedy greedy_ids

# Sampling: the same seed repeats, another seed gives another continuation.
for run in a:7 b:7 c:8; do
  gen "sample_${run%%:*}" --checkpoint "$CKPT" --prompt "The" --temperature 1.0 --top_k 50 \
    --top_p 0.95 --seed "${run##*:}" --max_new_tokens 40 --print_ids
done
same sample_a sample_b
cmp -s "$WORK/sample_a.out" "$WORK/sample_c.out" && fail "seeds 7 and 8 gave the same tokens"

# Text mode: the prompt and its continuation stream to stdout, tokens/s to stderr.
gen text --checkpoint "$CKPT" --prompt "Fellow citizens" --max_new_tokens 30 --seed 1
head -c 15 "$WORK/text.out" | grep -q "^Fellow citizens" ||
  fail "stdout does not start with the prompt"
[ "$(wc -c <"$WORK/text.out")" -gt 16 ] || fail "no text was generated"
grep -qE "decode [0-9.]+ tokens/s" "$WORK/text.err" || fail "no tokens/s line on stderr"

# --max_seq_len: the sequence stops at that length with a note.
gen short --checkpoint "$CKPT" --prompt_ids "$prompt_ids" --max_seq_len $((n_prompt + 6)) \
  --max_new_tokens 100 --print_ids --temperature 0
[ "$(wc -w <"$WORK/short.out")" -le $((n_prompt + 6)) ] || fail "--max_seq_len exceeded"
grep -q "stop: eos" "$WORK/short.err" ||
  grep -q "reached --max_seq_len $((n_prompt + 6))" "$WORK/short.err" ||
  fail "no note about --max_seq_len"
expect_exit 2 "$TITAN" generate --checkpoint "$CKPT" --prompt_ids "$prompt_ids" \
  --max_seq_len "$n_prompt"
expect_output "raise --max_seq_len"

# A Hugging Face export of the checkpoint generates the same greedy ids (when `titan convert`
# is built in).
if "$TITAN" convert --help >/dev/null 2>&1; then
  expect_exit 0 "$TITAN" convert to-hf "$CKPT" "$WORK/hf"
  gen greedy_hf --checkpoint "$WORK/hf" --prompt "The State of the Union" --temperature 0 \
    --max_new_tokens 40 --print_ids
  same greedy greedy_hf
else
  echo "note: titan convert is not available; skipped the Hugging Face generation check"
fi
echo "ok"
