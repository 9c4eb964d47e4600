#!/usr/bin/env bash
# MXFP8 (the OCP MX format: blocks of 32 e4m3 values sharing a power-of-two E8M0 scale): titan's
# cast (models/common/mx.h) against the pinned torchao's reference to_mx / to_dtype
# (tests/e2e/mx_reference.py writes random and edge-case inputs with torchao's bytes; the unit
# test Mx.MatchesTorchao, in test_models beside the titan binary, checks ours bit for bit).
source "$(dirname "$0")/lib.sh"
python_and_tests test_models
expect_exit 0 "$PY" "$(dirname "$0")/mx_reference.py" "$WORK/mx.safetensors"
TITAN_MX_FIXTURE="$WORK/mx.safetensors" expect_exit 0 "$TESTS" --gtest_filter=Mx.MatchesTorchao
expect_output "MX cast vs torchao"
! grep -q "SKIPPED" "$WORK/out" || fail "the comparison with torchao was skipped"
grep "vs torchao" "$WORK/out"
echo "PASS test_mx"
