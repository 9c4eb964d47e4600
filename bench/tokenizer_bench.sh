#!/usr/bin/env bash
# Single-threaded BPE encoding speed on the built-in sotu corpus (11 MB) with GPT-2's vocabulary:
# prints MB/s for a cold and a warm per-word cache. A benchmark, not a test: it never fails on
# speed.   bench/tokenizer_bench.sh [path/to/titan] [tokenizer path]
set -euo pipefail
cd "$(dirname "$0")/.."
titan="${1:-build/titan}"
cache="${TITAN_CACHE:-$HOME/.cache/titan}"
tokenizer="${2:-$cache/tokenizers/gpt2}"
[ -e "$tokenizer" ] || bash scripts/fetch_gpt2_tokenizer.sh
[ -d "$cache/datasets/sotu" ] || bash scripts/fetch_sotu.sh
OMP_NUM_THREADS=1 "$titan" tokenizer bench --tokenizer "$tokenizer" --input "$cache/datasets/sotu"
