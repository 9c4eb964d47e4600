#!/usr/bin/env bash
# BPE encoding speed on the built-in sotu corpus (233 documents, 10.8 MB) with GPT-2's vocabulary
# (or another tokenizer): MB/s on one thread and on all cores (documents in parallel), each for a
# cold and a warm per-piece cache. bench/tiktoken_bench.sh compares with npm tiktoken. A benchmark,
# not a test: it never fails on speed.   bench/tokenizer_bench.sh [path/to/titan] [tokenizer path]
set -euo pipefail
cd "$(dirname "$0")/.."
titan="${1:-build/titan}"
cache="${TITAN_CACHE:-$HOME/.cache/titan}"
tokenizer="${2:-$cache/tokenizers/gpt2}"
[ -e "$tokenizer" ] || bash scripts/fetch_gpt2_tokenizer.sh
[ -d "$cache/datasets/sotu" ] || bash scripts/fetch_sotu.sh
"$titan" tokenizer bench --tokenizer "$tokenizer" --input "$cache/datasets/sotu" --threads 0
