#!/usr/bin/env bash
# Fetches Hugging Face's JavaScript port of `tokenizers`, the npm package @huggingface/tokenizers
# 0.2.0 (Apache-2.0; pure JS, no dependencies, 87 kB), which loads tokenizer.json files the way
# the Rust library does. tests/e2e/test_tokenizer_hf.sh checks our trained tokenizer.json with it.
# Pinned by sha256 and unpacked atomically (scripts/cache_lib.sh) into
#   ${TITAN_CACHE:-$HOME/.cache/titan}/npm/huggingface-tokenizers-0.2.0/package/
# Offline: TITAN_TOKENIZERS_JS_TARBALL=/path/to/huggingface-tokenizers-0.2.0.tgz.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cache_lib.sh"

fetch_npm_package @huggingface/tokenizers 0.2.0 \
  2800014c83b8186b2e4210c20672f1fb65a12cef85d7e95e0f2003e022611b4a \
  "$(titan_cache_root)/npm/huggingface-tokenizers-0.2.0" TITAN_TOKENIZERS_JS_TARBALL \
  unpack_whole_package
