#!/usr/bin/env bash
# The vision-language model's pieces against transformers: tests/e2e/siglip2_reference.py saves a
# tiny random Siglip2VisionModel folder and one forward (two images of different patch grids,
# padded); the unit test Siglip2.MatchesTransformers (in test_models beside the titan binary)
# loads the folder and reproduces the last hidden state and the attention-pooled output.
source "$(dirname "$0")/lib.sh"
python_and_tests test_models
expect_exit 0 "$PY" "$(dirname "$0")/siglip2_reference.py" "$WORK/siglip2"
TITAN_SIGLIP2_FIXTURE="$WORK/siglip2" expect_exit 0 "$TESTS" --gtest_filter='Siglip2.*'
! grep -q "SKIPPED" "$WORK/out" || fail "the comparison with transformers was skipped"
[ "$(grep -c "vs transformers Siglip2VisionModel" "$WORK/out")" = 2 ] ||
  fail "expected the hidden state and pooled output comparisons"
grep "vs transformers Siglip2VisionModel" "$WORK/out"
echo "PASS test_vlm"
