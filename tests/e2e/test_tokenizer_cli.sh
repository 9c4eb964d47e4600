#!/usr/bin/env bash
# `titan tokenizer`: usage errors exit 2, file errors name the file, and encode/decode round-trip
# arbitrary bytes line by line through a small tiktoken file written here (256 byte ranks plus a
# few merges), so this test needs no download.
source "$(dirname "$0")/lib.sh"

# Ranks 0..255: the bytes; 256 "ab", 257 "abc", 258 " x".
tok="$WORK/tiny.tiktoken"
for b in $(seq 0 255); do
  printf "%s %d\n" "$(printf "\\x$(printf %02x "$b")" | base64)" "$b"
done >"$tok"
printf "%s 256\n%s 257\n%s 258\n" "$(printf ab | base64)" "$(printf abc | base64)" \
  "$(printf ' x' | base64)" >>"$tok"
[ "$(wc -l <"$tok")" = 259 ] || fail "tiny tokenizer has $(wc -l <"$tok") lines"

# Usage errors.
expect_exit 2 "$TITAN" tokenizer
expect_output "missing action"
expect_exit 2 "$TITAN" tokenizer frobnicate --tokenizer "$tok"
expect_output "unknown action 'frobnicate'"
expect_exit 2 "$TITAN" tokenizer encode
expect_output "--tokenizer is required"
expect_exit 2 "$TITAN" tokenizer encode --tokenizer
expect_output "needs a value"
expect_exit 2 "$TITAN" tokenizer encode --tokenizer "$tok" --bogus
expect_output "unknown argument '--bogus'"
expect_exit 2 "$TITAN" tokenizer encode --tokenizer "$WORK/missing"
expect_output "$WORK/missing' does not exist"
expect_exit 2 "$TITAN" tokenizer encode --tokenizer "$tok" --input "$WORK/nope.txt"
expect_output "nope.txt"
expect_exit 0 "$TITAN" tokenizer --help
expect_output "usage: titan tokenizer encode"

# Corrupt files: exit 1, message names the file and line.
printf 'QQ== 0\n%%%% 1\n' >"$WORK/bad.model"
expect_exit 1 "$TITAN" tokenizer encode --tokenizer "$WORK/bad.model" --input /dev/null
expect_output "bad.model:2"
echo '{"model": ' >"$WORK/tokenizer.json"
expect_exit 1 "$TITAN" tokenizer encode --tokenizer "$WORK/tokenizer.json" --input /dev/null
expect_output "tokenizer.json: not valid JSON"

# Known ids; stdin by default; one output line per input line (empty lines included).
printf 'abc x\n\nab!\n' >"$WORK/in.txt"
expect_exit 0 "$TITAN" tokenizer encode --tokenizer "$tok" --input "$WORK/in.txt"
printf '257 258\n\n256 33\n' >"$WORK/want.txt"
cmp "$WORK/out" "$WORK/want.txt" || { cat "$WORK/out" >&2; fail "encode ids differ"; }
"$TITAN" tokenizer encode --tokenizer "$tok" <"$WORK/in.txt" >"$WORK/stdin_ids.txt"
cmp "$WORK/stdin_ids.txt" "$WORK/want.txt" || fail "encode from stdin differs"
expect_exit 0 "$TITAN" tokenizer decode --tokenizer "$tok" --input "$WORK/want.txt"
cmp "$WORK/out" "$WORK/in.txt" || fail "decode did not restore the text"
echo '1 2 x' >"$WORK/bad_ids.txt"
expect_exit 1 "$TITAN" tokenizer decode --tokenizer "$tok" --input "$WORK/bad_ids.txt"
expect_output "'x' is not a token id"
echo '999999' >"$WORK/bad_ids.txt"
expect_exit 1 "$TITAN" tokenizer decode --tokenizer "$tok" --input "$WORK/bad_ids.txt"
expect_output "999999 is not in the vocabulary"

# Random bytes (invalid UTF-8 included) survive encode + decode, line by line.
head -c 20000 /dev/urandom >"$WORK/random.bin"
echo >>"$WORK/random.bin"
"$TITAN" tokenizer encode --tokenizer "$tok" --input "$WORK/random.bin" >"$WORK/random.ids"
"$TITAN" tokenizer decode --tokenizer "$tok" --input "$WORK/random.ids" >"$WORK/random.back"
cmp "$WORK/random.bin" "$WORK/random.back" || fail "random bytes did not round-trip"

# Train a small BPE on the corpus, round-trip with it, and train the model on it for a few steps.
cache="${TITAN_CACHE:-$HOME/.cache/titan}/datasets/sotu"
expect_exit 0 "$TITAN" tokenizer train --input "$cache" --vocab-size 1024 --output "$WORK/bpe"
expect_output "vocab 1024"
printf 'Fellow-Citizens of the Senate and House of Representatives\n' >"$WORK/line.txt"
"$TITAN" tokenizer encode --tokenizer "$WORK/bpe" --input "$WORK/line.txt" >"$WORK/line.ids"
"$TITAN" tokenizer decode --tokenizer "$WORK/bpe" --input "$WORK/line.ids" >"$WORK/line.back"
cmp "$WORK/line.txt" "$WORK/line.back" || fail "trained tokenizer did not round-trip"
[ "$(wc -w <"$WORK/line.ids")" -lt 40 ] || fail "trained tokenizer did not compress: $(cat "$WORK/line.ids")"
expect_exit 0 "$TITAN" train --job.config_file configs/llama3/debug_model.toml \
  --model.hf_assets_path "$WORK/bpe" --job.dump_folder "$WORK/run" --training.steps 3 \
  --training.seq_len 64 --validation.enable=false --metrics.log_freq 1
expect_output "tokenizer vocab 1024"
expect_exit 2 "$TITAN" tokenizer train --input "$cache" --vocab-size 100 --output "$WORK/bad"
expect_output "vocab"
# A text too small for the vocabulary asked for says so (it used to stop short silently).
expect_exit 0 "$TITAN" tokenizer train --input "$WORK/line.txt" --vocab-size 10000000 \
  --output "$WORK/short"
expect_output "note: the training text allows only [0-9]+ merges: vocab [0-9]+ of the 10000000 asked for"

# From a registered dataset, as training reads it: sotu is the training split only (210 of the
# 233 addresses), and the result does not depend on anything but the documents.
expect_exit 0 "$TITAN" tokenizer train --dataset sotu_validation --vocab-size 400 \
  --output "$WORK/val"
expect_output "read 23 documents of dataset 'sotu_validation'"
expect_exit 0 "$TITAN" tokenizer train --dataset sotu_validation --dataset-path "$cache" \
  --vocab-size 400 --output "$WORK/val2"
cmp "$WORK/val/tokenizer.json" "$WORK/val2/tokenizer.json" || fail "dataset training not deterministic"
expect_exit 0 "$TITAN" tokenizer train --dataset sotu --vocab-size 300 --output "$WORK/train"
expect_output "read 210 documents of dataset 'sotu'"
expect_exit 2 "$TITAN" tokenizer train --dataset sotu --input "$cache" --vocab-size 300 \
  --output "$WORK/bad"
expect_output "either --input PATH... or --dataset NAME"
expect_exit 2 "$TITAN" tokenizer train --dataset sotuu --vocab-size 300 --output "$WORK/bad"
expect_output "did you mean 'sotu'"
expect_exit 2 "$TITAN" tokenizer train --dataset text --vocab-size 300 --output "$WORK/bad"
expect_output "--dataset-path"

# The default config names ./assets/tokenizer/sotu_2k (built by scripts/setup.sh); run from
# elsewhere, the error says so.
root="$PWD"
titan_abs="$(realpath "$TITAN")"
(cd "$WORK" && expect_exit 2 "$titan_abs" train --job.config_file \
  "$root/configs/llama3/debug_model.toml" --job.dump_folder "$WORK/elsewhere")
expect_output "'./assets/tokenizer/sotu_2k' does not exist \(relative to the current directory"
expect_output "scripts/setup.sh"

# bench: one thread, then N threads, same token counts.
expect_exit 0 "$TITAN" tokenizer bench --tokenizer "$WORK/bpe" --input "$cache" --threads 2
expect_output "encode, 1 thread, cold cache: 233 docs"
n1=$(grep "1 thread, cold" "$WORK/out" | sed -E 's/.* ([0-9]+) tokens .*/\1/')
n2=$(grep "2 threads, warm" "$WORK/out" | sed -E 's/.* ([0-9]+) tokens .*/\1/')
[ -n "$n1" ] && [ "$n1" = "$n2" ] || { cat "$WORK/out" >&2; fail "bench token counts differ"; }
expect_exit 2 "$TITAN" tokenizer bench --tokenizer "$WORK/bpe" --input "$cache" --threads -1
expect_output "--threads expects a non-negative integer"
echo "tokenizer cli: ok"
