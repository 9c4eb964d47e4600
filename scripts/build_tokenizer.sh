#!/usr/bin/env bash
# Builds the default tokenizer of configs/llama3/debug_model.toml: a byte-level BPE of 2,048 ids
# (256 bytes, 1,790 merges, <|begin_of_text|>, <|end_of_text|>; TorchTitan's debug model also has
# 2,048) trained by `titan tokenizer train` on the `sotu` training split only (the held-out years
# ending in 5 stay unseen), into
#   ${TITAN_CACHE:-$HOME/.cache/titan}/tokenizers/sotu_2k/tokenizer.json
# and links that folder as assets/tokenizer/sotu_2k, the repo-relative model.hf_assets_path of the
# config (TorchTitan's ./assets/tokenizer convention; the link is not tracked by git).
#
# Training is deterministic and takes seconds. The stamp keys the result on all that decides it:
# the sha256 of the titan binary, the corpus stamp and the options; a second run with the same
# binary and corpus only checks the link. Called by scripts/setup.sh after the build.
#   scripts/build_tokenizer.sh [path/to/titan]     (default ${TITAN_BUILD_DIR:-build}/titan)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/cache_lib.sh"

readonly NAME="sotu_2k"
readonly DATASET="sotu"
readonly VOCAB_SIZE=2048
readonly STAMP_NAME=".built"

titan="${1:-${TITAN_BUILD_DIR:-$root/build}/titan}"
[[ -x "$titan" ]] || cache_die "${titan} not found; build it first (scripts/setup.sh)"
cache="$(titan_cache_root)"
corpus="${cache}/datasets/sotu"
target="${cache}/tokenizers/${NAME}"
link="${root}/assets/tokenizer/${NAME}"

[[ -f "${corpus}/.fetched" ]] || cache_die "no corpus in ${corpus}; run scripts/fetch_sotu.sh"
key="titan sha256=$(sha256_of "$titan"); corpus $(cat "${corpus}/.fetched");"
key+=" dataset=${DATASET} vocab_size=${VOCAB_SIZE}"

if stamp_matches "$target" "$key" "$STAMP_NAME" && [[ -f "${target}/tokenizer.json" ]]; then
  echo "build_tokenizer: ${NAME} is up to date in ${target}"
else
  mkdir -p "$(dirname "$target")"
  work="$(mktemp -d "${target}.tmp.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  echo "build_tokenizer: training ${NAME} (vocab ${VOCAB_SIZE}) on dataset ${DATASET}"
  "$titan" tokenizer train --dataset "$DATASET" --dataset-path "$corpus" \
    --vocab-size "$VOCAB_SIZE" --output "${work}/${NAME}"
  install_stamped "${work}/${NAME}" "$target" "$key" "$STAMP_NAME"
fi

# The link (or a stray folder in its place) is replaced only when it points elsewhere.
if [[ "$(readlink "$link" 2>/dev/null)" != "$target" ]]; then
  mkdir -p "$(dirname "$link")"
  [[ -L "$link" || ! -e "$link" ]] || rm -rf "$link"
  ln -sfn "$target" "$link"
fi
echo "build_tokenizer: ${link#"${root}/"} -> ${target}"
