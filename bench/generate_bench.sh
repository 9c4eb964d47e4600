#!/usr/bin/env bash
# Generation-speed benchmark: `titan generate` against Hugging Face transformers' generate loop
# (bench/hf_generate.py, the project's Python: torch 2.15, transformers) on the very same model,
# on the CPU, greedy, with the KV cache, one thread each. For each flavor the script trains a
# llama3 model briefly on the built-in sotu corpus (so that greedy continuations are not
# degenerate), exports it with titan's own `titan convert to-hf` (float32 safetensors, its
# tokenizer and eos id), and runs both sides on that folder: float32, then bfloat16 (both cast
# the float32 weights at load). Models, both with the sotu_2k tokenizer (2,048 ids):
#   debugmodel    dim 256, 6 layers, 16 heads, vocab 2048          (the default debug model)
#   bench_medium  dim 512, 8 layers, 8 heads, vocab 32000          (run_bench.sh's model b)
# Both get the same prompt: the first PROMPT_LEN ids (BOS first) of a fixed English text encoded
# with the model's tokenizer, fed as ids; then NEW_TOKENS greedy tokens (fewer if EOS comes).
#
# What is timed, the same on both sides: decode = from the moment the first new token is chosen
# to the moment the last one is, i.e. NEW_TOKENS - 1 single-token steps (forward over the newest
# token with the cache, logits, argmax). Model loading, process start-up and the prefill (the
# forward over the prompt and the first token) are outside it. titan reports it itself
# (src/titan/inference/generator.cpp: "decode X tokens/s" on stderr); for transformers a
# streamer records the time of each new token as generate hands it out (see hf_generate.py).
# transformers masks ids past the tokenizer's vocabulary as titan does (--vocab-limit) and uses
# its default attention (sdpa). Each side runs REPEATS times (titan: separate processes;
# transformers: one process); the table shows the best of each.
#
# The ids column says whether the greedy ids agree (a sanity check of "the same model": `same`,
# or how many of the new tokens agree before the first difference; float32 rounding differs
# between the two, so a near tie can flip a late token, more so in bfloat16).
# A benchmark, not a test: it never fails on speed.
#   bench/generate_bench.sh                                   # both flavors, float32 and bf16
#   FLAVORS=debugmodel DTYPES=float32 bench/generate_bench.sh # one case
#   PROMPT_LEN=32 NEW_TOKENS=128 REPEATS=3 TRAIN_STEPS=20     # the defaults
#   MODELS_DIR=DIR bench/generate_bench.sh   # keep the trained exports in DIR and reuse them
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
flavors="${FLAVORS:-debugmodel bench_medium}"
dtypes="${DTYPES:-float32 bfloat16}"
prompt_len="${PROMPT_LEN:-32}"
new_tokens="${NEW_TOKENS:-128}"
repeats="${REPEATS:-3}"
train_steps="${TRAIN_STEPS:-20}"
titan="$root/build/titan"
[ -x "$titan" ] || bash "$root/scripts/setup.sh"
py="$(bash "$root/scripts/python_env.sh")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
models="${MODELS_DIR:-$work}"
mkdir -p "$models"
cores=$(nproc)
# One thread each, and no network for transformers (the folders are local).
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
text="Fellow citizens of the Senate and of the House of Representatives: the state of the \
Union is strong, and our economy continues to grow while we work together for the peace and \
prosperity of every family in this great nation, from the farms of the heartland to the cities."

# or_die NAME CMD...: runs CMD with stdout in $work/NAME.out and stderr in $work/NAME.log; on
# failure shows the log and stops.
or_die() {
  local name="$1"; shift
  "$@" >"$work/$name.out" 2>"$work/$name.log" ||
    { echo "error: $name failed: $*" >&2; tail -n 30 "$work/$name.log" >&2; exit 1; }
}
best() { sort -g | tail -n 1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b; else print "-" }'; }

# agreement A B: "same" when the id lists are equal, else "K/N" (new tokens equal before the
# first difference, of N new tokens titan made).
agreement() {
  awk -v a="$1" -v b="$2" -v p="$prompt_len" 'BEGIN {
    n = split(a, x, " "); m = split(b, y, " ")
    if (a == b) { print "same"; exit }
    for (i = p + 1; i <= n && i <= m && x[i] == y[i]; i++) {}
    printf "%d/%d\n", i - p - 1, n - p }'
}

echo "# decode tokens/s (best of $repeats), 1 thread, $cores cores, prompt $prompt_len ids," \
  "$new_tokens new tokens, greedy with KV cache; PyTorch $("$py" -c 'import torch, transformers
print(torch.__version__, "transformers", transformers.__version__)')"
fmt='%-13s %-9s %6s %5s %10s %10s %7s %10s %10s %8s\n'
printf "$fmt" model dtype prompt new titan_tok/s hf_tok/s ratio titan_pre_s hf_pre_s ids
for flavor in $flavors; do
  run="$models/run_$flavor" hf="$models/hf_$flavor"
  [ -f "$hf/config.json" ] || or_die "train-$flavor" env OMP_NUM_THREADS="$cores" "$titan" train --job.config_file "$root/configs/llama3/debug_model.toml" \
    --model.flavor "$flavor" --model.hf_assets_path "$root/assets/tokenizer/sotu_2k" \
    --job.dump_folder "$run" --training.steps "$train_steps" --training.seq_len 128 \
    --training.local_batch_size 4 --lr_scheduler.warmup_steps 5 --validation.enable=false \
    --activation_checkpoint.mode none --metrics.log_freq "$train_steps" \
    --metrics.disable_color_printing --checkpoint.enable --checkpoint.interval "$train_steps" \
    --training.num_threads "$cores"
  [ -f "$hf/config.json" ] || or_die "export-$flavor" "$titan" convert to-hf "$run/checkpoint" "$hf" --dtype float32
  # The prompt: BOS and the text's first ids, as the model's tokenizer encodes them.
  or_die "prompt-$flavor" "$titan" generate --checkpoint "$hf" --prompt "$text" \
    --max_new_tokens 0 --print_ids --threads 1
  prompt=$(tr ' ' '\n' <"$work/prompt-$flavor.out" | head -n "$prompt_len" | tr '\n' ' ')
  [ "$(wc -w <<<"$prompt")" = "$prompt_len" ] ||
    { echo "error: the text encodes to fewer than $prompt_len ids" >&2; exit 1; }
  vocab_limit=$("$py" -c 'import sys, tokenizers
print(tokenizers.Tokenizer.from_file(sys.argv[1] + "/tokenizer.json").get_vocab_size())' "$hf")
  for dtype in $dtypes; do
    id="$flavor-$dtype" t_tps="" t_pre=""
    for ((r = 1; r <= repeats; r++)); do
      or_die "$id-titan" "$titan" generate --checkpoint "$hf" --prompt_ids "$prompt" \
        --temperature 0 --max_new_tokens "$new_tokens" --print_ids --threads 1 --dtype "$dtype"
      line=$(grep "^generated " "$work/$id-titan.log")
      t_tps+="$(sed -E 's/.*decode ([0-9.]+) tokens\/s.*/\1/' <<<"$line") "
      t_pre+="$(sed -E 's/.*tokens ([0-9.]+) s \(.*/\1/' <<<"$line") "
    done
    t_ids=$(sed 's/ *$//' "$work/$id-titan.out")
    or_die "$id-hf" "$py" "$root/bench/hf_generate.py" "$hf" --prompt-ids "$prompt" \
      --new-tokens "$new_tokens" --dtype "$dtype" --threads 1 --repeats "$repeats" \
      --vocab-limit "$vocab_limit"
    h_tps=$(grep -o 'decode_tokens_per_s=[0-9.]*' "$work/$id-hf.out" | cut -d= -f2 | best)
    h_pre=$(grep -o 'prefill_s=[0-9.]*' "$work/$id-hf.out" | cut -d= -f2 | sort -g | head -n 1)
    h_ids=$(sed -n 's/^hf ids //p' "$work/$id-hf.out")
    t_best=$(tr ' ' '\n' <<<"$t_tps" | grep . | best)
    printf "$fmt" "$flavor" "$dtype" "$prompt_len" "$new_tokens" "$t_best" "$h_tps" \
      "$(ratio "$t_best" "$h_tps")" "$(tr ' ' '\n' <<<"$t_pre" | grep . | sort -g | head -n 1)" \
      "$h_pre" "$(agreement "$t_ids" "$h_ids")"
  done
done
