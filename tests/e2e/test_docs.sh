#!/usr/bin/env bash
# The documentation against the tree and the binary (tests/e2e/check_docs.py): over README.md
# and docs/*.md, every relative link names a file that exists (and a #anchor a heading of it),
# every repository path in inline code exists, every titan invocation in code names a real
# subcommand, action and flags that `titan X --help` lists, and every --section.key (and
# `section.key` in inline code) is a config key of `titan train --help`. Each problem is printed
# as FILE:LINE. The docs must pass; then the checker must catch one mistake of each kind on a
# page written here (a checker that passes everything would pass the docs too). A few seconds:
# the binary is only asked for its help texts, once each (helps.json).
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-python3}"
TITAN="$(cd "$(dirname "$TITAN")" && pwd)/$(basename "$TITAN")"

# The real docs.
"$PY" tests/e2e/check_docs.py --helps "$WORK/helps.json" "$TITAN" >"$WORK/out" 2>&1 || {
  cat "$WORK/out" >&2
  fail "the docs name links, paths, commands, flags or config keys that do not exist (above)"
}
# The checker must have seen the docs' commands: an empty run would pass anything.
invocations="$(sed -nE 's/.* ([0-9]+) titan invocations.*/\1/p' "$WORK/out")"
[ "${invocations:-0}" -ge 100 ] ||
  { cat "$WORK/out" >&2; fail "only ${invocations:-0} titan invocations found in the docs"; }
cp "$WORK/out" "$WORK/real.out"

# A copy of the docs beside the real tree, with one page of mistakes.
mkdir -p "$WORK/repo"
for d in src apps tests scripts bench configs cmake; do ln -s "$PWD/$d" "$WORK/repo/$d"; done
cp README.md "$WORK/repo/"
cp -r docs "$WORK/repo/docs"
cat >"$WORK/repo/docs/broken.md" <<'PAGE'
# Broken

See [a page](missing.md), [an anchor](configuration.md#no-such-heading) and
[a good one](configuration.md#outputs), and `src/titan/no_such_file.h`.

```bash
build/titan train --job.config_file configs/llama3/debug_model.toml --training.stepz 10 \
    --no_such_flag
build/titan run --nproc_per_node 2 -- train --parallelism.tensor_paralel_degree 2
build/titan trian --help
```

`titan convert to-gguf`, `titan generate --checkpoint x --no_kv_cahce`, `--top_kk` and
`metrics.log_frequency`.
PAGE
expect_exit 1 "$PY" tests/e2e/check_docs.py --helps "$WORK/helps.json" --root "$WORK/repo" \
  "$TITAN" docs/broken.md
for want in "docs/broken.md:3: link 'missing.md'" \
            "docs/broken.md:3: link 'configuration.md#no-such-heading': no heading" \
            "docs/broken.md:4: \`src/titan/no_such_file.h\` does not exist" \
            "docs/broken.md:7: --training.stepz is not a config key \(nearest: training.steps\)" \
            "docs/broken.md:8: \`titan train\` has no flag --no_such_flag" \
            "docs/broken.md:9: --parallelism.tensor_paralel_degree is not a config key" \
            "docs/broken.md:10: \`titan trian\`: no such subcommand \(nearest: train\)" \
            "docs/broken.md:13: \`titan convert to-gguf\`: no such action" \
            "docs/broken.md:13: \`titan generate\` has no flag --no_kv_cahce \(nearest: --no_kv_c" \
            "docs/broken.md:13: --top_kk is not a flag" \
            "docs/broken.md:14: \`metrics.log_frequency\` is not a config key"; do
  expect_output "$want"
done
grep -q "outputs" "$WORK/out" && { cat "$WORK/out" >&2; fail "a good anchor was reported"; }
[ "$(grep -c '^docs/broken.md:' "$WORK/out")" = 11 ] ||
  { cat "$WORK/out" >&2; fail "expected exactly the 11 mistakes of docs/broken.md"; }
cat "$WORK/real.out"
