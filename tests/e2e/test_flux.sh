#!/usr/bin/env bash
# FLUX.1 (models/flux) against the pinned diffusers: tests/e2e/flux_reference.py saves tiny random
# FluxTransformer2DModel folders (with and without the guidance embedding) and one forward's
# inputs and output; the unit test FluxDiffusers.MatchesDiffusers (in test_models beside the
# titan binary) loads each folder through our diffusers adapter, reproduces the output and
# writes the tensors back under diffusers' names bit for bit; FluxDiffusers.AutoencoderMatchesDiffusers
# does the same for a tiny AutoencoderKL of FLUX.1's layout (encoder moments, the transformer's
# scaled and shifted latents, decoding); TextEncoders.* the T5 and CLIP text encoders against
# transformers' T5EncoderModel and CLIPTextModel (CLIP with both end-of-text rules).
source "$(dirname "$0")/lib.sh"
python_and_tests test_models
expect_exit 0 "$PY" "$(dirname "$0")/flux_reference.py" "$WORK/flux"
TITAN_FLUX_FIXTURE="$WORK/flux" expect_exit 0 "$TESTS" --gtest_filter='FluxDiffusers.*:TextEncoders.*'
! grep -q "SKIPPED" "$WORK/out" || fail "the comparison with diffusers was skipped"
grep "vs diffusers FluxTransformer2DModel" "$WORK/out"
[ "$(grep -c "vs diffusers FluxTransformer2DModel" "$WORK/out")" = 2 ] ||
  fail "expected the schnell and dev comparisons"
[ "$(grep -c "vs diffusers AutoencoderKL" "$WORK/out")" = 3 ] ||
  fail "expected the autoencoder's three comparisons"
grep -q "t5 encoder vs transformers T5EncoderModel" "$WORK/out" || fail "no T5 comparison"
[ "$(grep -c "vs transformers CLIPTextModel" "$WORK/out")" = 4 ] ||
  fail "expected CLIP's hidden states and pooled outputs under both end-of-text rules"
echo "PASS test_flux"
