#!/usr/bin/env bash
# MXFP8 (the OCP MX format: blocks of 32 e4m3 values sharing a power-of-two E8M0 scale): titan's
# cast (models/common/mx.h) against the pinned torchao's reference to_mx / to_dtype
# (tests/e2e/mx_reference.py writes random and edge-case inputs with torchao's bytes; the unit
# test Mx.MatchesTorchao, in test_models beside the titan binary, checks ours bit for bit).
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh --print)\" bash $0 $TITAN"
export OMP_NUM_THREADS=2
TESTS="$(dirname "$TITAN")/test_models"
[ -x "$TESTS" ] || fail "no $TESTS beside $TITAN (build the unit tests)"
expect_exit 0 "$PY" "$(dirname "$0")/mx_reference.py" "$WORK/mx.safetensors"
TITAN_MX_FIXTURE="$WORK/mx.safetensors" expect_exit 0 "$TESTS" --gtest_filter=Mx.MatchesTorchao
expect_output "MX cast vs torchao"
! grep -q "SKIPPED" "$WORK/out" || fail "the comparison with torchao was skipped"
grep "vs torchao" "$WORK/out"
echo "PASS test_mx"
