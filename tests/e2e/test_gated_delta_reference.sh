#!/usr/bin/env bash
# The gated delta rule (Qwen3-Next's linear attention, models/common/gated_delta.h) against
# transformers' pure-torch reference functions: tests/e2e/gated_delta_reference.py writes random
# inputs with transformers' chunked and recurrent outputs and final states (chunks of 8 over 21
# positions, an initial state), and the unit test GatedDelta.MatchesTransformers (in test_models,
# beside the titan binary) checks ours against them within 1e-5; and a random
# Qwen3NextGatedDeltaNet layer's output, which GatedDeltaNet.MatchesTransformers checks ours
# (models/common/gated_delta_net.h, the same weights) against within 1e-5; and a random
# Qwen3NextAttention's (partial RoPE, zero-centred q/k norms, output gate), which
# Qwen3NextParts.AttentionMatchesTransformers checks our Attention against within 1e-5.
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh --print)\" bash $0 $TITAN"
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
TESTS="$(dirname "$TITAN")/test_models"
[ -x "$TESTS" ] || fail "no $TESTS beside $TITAN (build the unit tests)"
expect_exit 0 "$PY" "$(dirname "$0")/gated_delta_reference.py" "$WORK/gated_delta.safetensors"
TITAN_GATED_DELTA_FIXTURE="$WORK/gated_delta.safetensors" expect_exit 0 "$TESTS" \
  --gtest_filter=GatedDelta.MatchesTransformers:GatedDeltaNet.MatchesTransformers:Qwen3NextParts.AttentionMatchesTransformers
expect_output "gated delta vs transformers"
expect_output "Gated DeltaNet layer vs transformers"
expect_output "Qwen3-Next gated attention vs transformers"
! grep -q "SKIPPED" "$WORK/out" || fail "a comparison was skipped"
grep "vs transformers" "$WORK/out"
echo "PASS test_gated_delta_reference"
