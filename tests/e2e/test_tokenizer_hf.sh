#!/usr/bin/env bash
# A tokenizer.json from `titan tokenizer train` loads in Hugging Face's JavaScript `tokenizers`
# (npm @huggingface/tokenizers, fetched by scripts/fetch_tokenizers_js.sh) and gives exactly our
# ids, and decodes back to the text, on thousands of corpus lines, the corpus as one text and
# adversarial strings. Outside CI it skips (exit 0 with SKIP) when node or the package is
# unavailable offline; under CI (CI=true) that is a failure.
source "$(dirname "$0")/lib.sh"

cache="${TITAN_CACHE:-$HOME/.cache/titan}"
js="$cache/npm/huggingface-tokenizers-0.2.0/package"
sotu="$cache/datasets/sotu"
skip() { [ "${CI:-}" = true ] && fail "$1 (required under CI)"; echo "SKIP: $1"; exit 0; }
command -v node >/dev/null 2>&1 || skip "node is not installed"
bash scripts/fetch_tokenizers_js.sh >/dev/null 2>&1 || true
[ -f "$js/dist/tokenizers.cjs" ] || skip "@huggingface/tokenizers unavailable (offline?)"
ls "$sotu"/*.txt >/dev/null 2>&1 || fail "no sotu corpus in $sotu; run scripts/setup.sh"

# The training split through the dataset registry, vocabulary larger than the default's so more
# (and longer) merges are compared.
expect_exit 0 "$TITAN" tokenizer train --dataset sotu --vocab-size 4096 --output "$WORK/bpe"
expect_output "read 210 documents of dataset 'sotu'"
expect_output "vocab 4096"
tok="$WORK/bpe/tokenizer.json"

# compare FILE [--whole]: titan ids == tokenizers.js ids (which must also decode to the text).
compare() {
  "$TITAN" tokenizer encode --tokenizer "$tok" --input "$1" ${2:-} >"$WORK/ours.txt"
  node scripts/hf_tokenizers_encode.js "$js" "$tok" "$1" ${2:-} >"$WORK/ref.txt" ||
    fail "tokenizers.js failed on $1 ${2:-}"
  if ! cmp -s "$WORK/ours.txt" "$WORK/ref.txt"; then
    diff <(tr ' ' '\n' <"$WORK/ours.txt") <(tr ' ' '\n' <"$WORK/ref.txt") | head -20 >&2
    fail "ids differ from tokenizers.js on $1 ${2:-}"
  fi
  echo "$(basename "$1") ${2:-}: $(wc -w <"$WORK/ours.txt") ids identical"
}

cat >"$WORK/adversarial.txt" <<'TEXT'
Hello world
   leading spaces and trailing spaces     
tabs	and	mixed 	 	whitespace  	
I'm you're they'll we've he'd it's DON'T 'S ''s 're' o'clock rock'n'roll
1234567890 3.14159 1,000,000 2024-01-01 ١٢٣ ½ Ⅻ 000000000000000000000000
emoji 🙂🙂👍🏽 👨‍👩‍👧 flags 🇺🇸🇯🇵 
中文字符和日本語のテキスト 한국어 텍스트
Ελληνικά кириллица עברית العربية हिन्दी
combining: é ñ̃  zero​width no-break space: a b　c
$%^&*()_+{}|:"<>?~`-=[]\;',./ !!!??? ...
special tokens inside text: <|begin_of_text|>x<|end_of_text|> <|end_of_text|><|end_of_text|>
  x
TEXT
printf 'a\r\nb\r\r\n\x0b\x0c\xc2\x85 end\n' >>"$WORK/adversarial.txt"
compare "$WORK/adversarial.txt"
compare "$WORK/adversarial.txt" --whole

# Every 20th sentence of the corpus (each address is one line; validation years included, so
# text the tokenizer never saw), one per line, and the addresses of 1800-1819 as one text.
awk 1 "$sotu"/*.txt | sed 's/\([.?!]\) /\1\n/g' | awk 'NR % 20 == 0' >"$WORK/lines.txt"
[ "$(wc -l <"$WORK/lines.txt")" -ge 2000 ] || fail "expected >= 2000 corpus lines"
compare "$WORK/lines.txt"
awk 1 "$sotu"/18[01]?_*.txt >"$WORK/chunk.txt"
compare "$WORK/chunk.txt" --whole
echo "tokenizer hf: ok"
