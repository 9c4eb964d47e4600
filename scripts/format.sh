#!/usr/bin/env bash
# Lays C++ out by the repository's .clang-format with clang-format 14 (Debian's, installed by
# scripts/setup.sh). Files marked GENERATED in their first lines are left alone.
#
#   scripts/format.sh                   # format every .cpp/.h under src apps tests bench in place
#   scripts/format.sh FILE...           # format these files in place
#   scripts/format.sh --check [FILE...] # list the files whose layout differs; exit 1 if any does
#
# Others may be editing the tree: format the files you changed, not the whole of it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

check=0
if [ "${1:-}" = "--check" ]; then
  check=1
  shift
fi

if ! command -v clang-format >/dev/null 2>&1; then
  echo "format.sh: clang-format not found. HINT: run scripts/setup.sh (it installs clang-format)" >&2
  exit 2
fi
version="$(clang-format --version | grep -o 'version [0-9]*' | cut -d' ' -f2)"
if [ "$version" != 14 ]; then
  echo "format.sh: warning: clang-format $version; .clang-format is tuned for 14 (scripts/setup.sh)," \
    "other versions may lay some lines out differently" >&2
fi

files=("$@")
if ((${#files[@]} == 0)); then
  mapfile -t files < <(cd "$root" && git ls-files --cached --others --exclude-standard \
    -- src apps tests bench | grep -E '\.(cpp|h)$' | sed "s|^|$root/|")
fi

differ=0
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "format.sh: no file $f" >&2; exit 2; }
  # clang-format would lay a shell script or a TOML out as C++ without a word.
  [[ "$f" =~ \.(cpp|h|hpp|cc)$ ]] ||
    { echo "format.sh: $f is not C++ (.cpp, .h, .hpp, .cc); left alone" >&2; continue; }
  head -n 3 "$f" | grep -q GENERATED && continue
  if ((check)); then
    if ! clang-format --style=file "$f" | cmp -s - "$f"; then
      echo "${f#"$root"/}"
      differ=1
    fi
  else
    clang-format --style=file -i "$f"
  fi
done
exit "$differ"
