#!/usr/bin/env bash
# Our byte-level BPE gives exactly the ids of the pinned Python libraries (tests/e2e/
# tokenizer_reference.py, run with $TITAN_PYTHON): Hugging Face `tokenizers` and `tiktoken`, on
# every document of the sotu corpus, adversarial strings (scripts, combining marks, emoji
# sequences, every kind of space and line break, controls, long runs, contractions, text that looks
# like special tokens) and random Unicode, each text alone and all as one text. Tokenizers:
#   - a tokenizer.json trained by `titan tokenizer train` (and its add_prefix_space variant);
#   - GPT-2's files (scripts/fetch_gpt2_tokenizer.sh) as titan reads the folder, against both
#     libraries (tiktoken: its own "gpt2" encoding), and as a tokenizer.json with <|endoftext|>;
#   - GPT-2's vocabulary with Llama 3's pre-tokenizer, as a tokenizer.json (Split regex,
#     ignore_merges) and as a tiktoken rank file (Llama 3's tokenizer.model format);
#   - T5's unigram tokenizer (SentencePiece's spiece.model as titan reads the folder, and
#     transformers' tokenizer.json of it) and CLIP's (vocab.json + merges.txt, and transformers'
#     tokenizer.json), trained on the corpus, against transformers' files run by tokenizers:
#     the precompiled nmt_nfkc rules by grapheme cluster, Metaspace, the unigram Viterbi, NFC,
#     lowercase, CLIP's regex and "</w>" word ends;
# plus: our Unicode class and normalizer tables are the libraries' data, corrupt T5 / CLIP files
# are named with the offset, and random bytes (invalid UTF-8, which neither library takes)
# round-trip. About 90 s on 2 cores.
source "$(dirname "$0")/lib.sh"

PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set; ctest sets it, by hand:" \
  "TITAN_PYTHON=\$(scripts/python_env.sh --print) bash $0 $TITAN"
REF="$(dirname "$0")/tokenizer_reference.py"
export HF_HUB_OFFLINE=1 RAYON_NUM_THREADS=2
cache="${TITAN_CACHE:-$HOME/.cache/titan}"
gpt2="$cache/tokenizers/gpt2"
sotu="$cache/datasets/sotu"
ls "$sotu"/*.txt >/dev/null 2>&1 || fail "no sotu corpus in $sotu; run scripts/setup.sh"
bash scripts/fetch_gpt2_tokenizer.sh >/dev/null || fail "GPT-2's files are unavailable (offline?)"

"$PY" "$REF" unicode-tables --check src/titan/components/tokenizer/unicode_tables.cpp ||
  fail "the Unicode tables differ from the Python libraries' regex classes"

"$PY" "$REF" normalizer-tables --check src/titan/components/tokenizer/unicode_norm_tables.cpp ||
  fail "the normalizer tables differ from the Python libraries' Unicode data"

# compare TOKENIZER KIND:PATH [compare options]: titan's ids == the reference's.
compare() {
  local tokenizer="$1" reference="$2"
  shift 2
  "$PY" "$REF" compare --titan "$TITAN" --tokenizer "$tokenizer" --reference "$reference" \
    --work "$WORK" "$@" || fail "titan and $reference give different ids"
}

# Our own tokenizer.json: the training split through the dataset registry, 4096 ids.
expect_exit 0 "$TITAN" tokenizer train --dataset sotu --vocab-size 4096 --output "$WORK/bpe"
expect_output "read 210 documents of dataset 'sotu'"
tok="$WORK/bpe/tokenizer.json"
compare "$tok" "hf:$tok" --corpus "$sotu" --adversarial --random 200000 --decode
mkdir "$WORK/bpe_prefix"
"$PY" "$REF" with-prefix-space "$tok" "$WORK/bpe_prefix/tokenizer.json"
compare "$WORK/bpe_prefix/tokenizer.json" "hf:$WORK/bpe_prefix/tokenizer.json" --adversarial \
  --random 20000

# GPT-2: the folder (encoder.json + vocab.bpe), a tokenizer.json, Llama 3's pre-tokenizer.
"$PY" "$REF" prepare "$gpt2" "$WORK"
compare "$gpt2" "tiktoken-gpt2:$gpt2" --corpus "$sotu" --whole-corpus --adversarial \
  --random 200000
compare "$gpt2" "hf-gpt2:$gpt2" --adversarial --random 200000
compare "$WORK/gpt2_json/tokenizer.json" "hf:$WORK/gpt2_json/tokenizer.json" --adversarial \
  --random 20000 --decode
compare "$WORK/gpt2.tiktoken" "tiktoken-file:$WORK/gpt2.tiktoken" --corpus "$sotu" \
  --whole-corpus --adversarial --random 200000
compare "$WORK/gpt2_llama3/tokenizer.json" "hf:$WORK/gpt2_llama3/tokenizer.json" --adversarial \
  --random 200000

# T5 (unigram) and CLIP (BPE with "</w>"): the files a FLUX run's text encoders bring.
"$PY" "$REF" prepare-t5-clip "$sotu" "$WORK" >/dev/null 2>&1 ||
  fail "could not write T5's and CLIP's tokenizer files with transformers"
compare "$WORK/t5_spm" "hf:$WORK/t5/tokenizer.json" --corpus "$sotu" --adversarial --random 200000
compare "$WORK/t5/tokenizer.json" "hf:$WORK/t5/tokenizer.json" --adversarial --random 20000
compare "$WORK/clip_files" "hf:$WORK/clip/tokenizer.json" --corpus "$sotu" --adversarial \
  --random 200000
compare "$WORK/clip/tokenizer.json" "hf:$WORK/clip/tokenizer.json" --adversarial --random 20000
# Sentinels and specials split out of the text; T5 decodes to the text; a corrupt spiece.model
# is named with its byte offset.
printf 'a photo <extra_id_0> of </s> a Cat\n' >"$WORK/special.txt"
"$TITAN" tokenizer encode --tokenizer "$WORK/t5_spm" --input "$WORK/special.txt" >"$WORK/special.ids"
"$TITAN" tokenizer decode --tokenizer "$WORK/t5_spm" --input "$WORK/special.ids" >"$WORK/special.back"
grep -qx 'a photo of a Cat' "$WORK/special.back" ||
  fail "T5 decoding gave '$(cat "$WORK/special.back")'"
mkdir "$WORK/t5_bad"
head -c 3000 "$WORK/t5_spm/spiece.model" >"$WORK/t5_bad/spiece.model"
expect_exit 1 "$TITAN" tokenizer encode --tokenizer "$WORK/t5_bad" --input "$WORK/special.txt"
expect_output "not a SentencePiece model at byte offset"

# Invalid UTF-8 and arbitrary bytes: an exact round trip through titan.
head -c 100000 /dev/urandom >"$WORK/random.bin"
echo >>"$WORK/random.bin"
"$TITAN" tokenizer encode --tokenizer "$gpt2" --input "$WORK/random.bin" >"$WORK/random.ids"
"$TITAN" tokenizer decode --tokenizer "$gpt2" --input "$WORK/random.ids" >"$WORK/random.back"
cmp -s "$WORK/random.bin" "$WORK/random.back" || fail "random bytes did not round-trip"
echo "tokenizer reference: ok"
