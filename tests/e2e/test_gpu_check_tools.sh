# The CPU-testable parts of scripts/gpu_check.sh: its PyTorch reference builds the model titan
# builds (parameter count and FLOPs per token equal to `titan inspect`'s, flavor by flavor) and
# trains on the CPU; its report helper computes parity and speed from metrics.jsonl rows; the
# script refuses, with exit 2 and a message, to run without a GPU, and an unknown stage; and its
# whole default run goes through on the CPU (--cpu-dry-run, this build's binaries, small sizes):
# every stage ok, the shared-device parallel stage and the CUDA unit tests' CPU parts included,
# the summary saying that no GPU was used. About 90 s on 2 cores, 65 of them the dry run.
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-python3}"

# Sizes by the reference, in one Python process (importing torch is most of the time).
"$PY" - >"$WORK/ref_sizes" <<'EOF'
import sys
sys.path.insert(0, "bench")
import torch_reference as ref
for flavor, seq in (("debugmodel", 256), ("1B", 2048), ("8B_cut", 8192)):  # untied, tied, GPU's
    n_params, _, flops = ref.sizes_without_allocating(ref.FLAVORS[flavor], seq)
    print(flavor, seq, n_params, flops)
EOF
[ "$(wc -l <"$WORK/ref_sizes")" = 3 ] || fail "reference sizes: $(cat "$WORK/ref_sizes")"
while read -r flavor seq ref_params ref_flops <&3; do
  expect_exit 0 "$TITAN" inspect --model.flavor "$flavor" --training.seq_len "$seq" \
    --training.local_batch_size 1
  titan_params="$(sed -nE 's/^parameters +([0-9,]+) total.*/\1/p' "$WORK/out" | tr -d ,)"
  titan_flops="$(sed -nE 's/^FLOPs per token +([0-9.e+]+) .*/\1/p' "$WORK/out")"
  [ -n "$titan_params" ] && [ -n "$titan_flops" ] || { cat "$WORK/out" >&2; fail "inspect output"; }
  echo "$flavor: titan $titan_params params, $titan_flops FLOPs/token;" \
    "reference $ref_params, $ref_flops"
  [ "$titan_params" = "$ref_params" ] || fail "$flavor: parameters $titan_params != $ref_params"
  # inspect prints 4 significant digits.
  awk -v a="$titan_flops" -v b="$ref_flops" \
    'BEGIN { d = (a - b) / b; exit !(d < 1e-3 && d > -1e-3) }' ||
    fail "$flavor: FLOPs per token $titan_flops != $ref_flops"
done 3<"$WORK/ref_sizes"

# The reference trains on the CPU, eagerly, in bf16 (autocast).
expect_exit 0 "$PY" bench/torch_reference.py --flavor tiny --device cpu --dtype bfloat16 \
  --seq 32 --batch 2 --steps 2 --warmup 1 --threads 1 --json "$WORK/ref.json"
grep -q '"tokens_per_s": [0-9]' "$WORK/ref.json" || fail "reference: no tokens_per_s"
grep -q '"losses": \[[0-9]' "$WORK/ref.json" || fail "reference: no losses"

# Report helper: parity within and beyond the tolerance, speed over the timed window.
report=scripts/gpu_check_report.py
for i in 1 2 3; do
  printf '{"step": %d, "loss": %d.0, "tps": 100.0, "tflops": 2.0, "mfu": 40.0, ' $i $((10 - i))
  printf '"elapsed_s": %d.0, "memory_gib": 1.5}\n' $((2 * i))
done >"$WORK/a.jsonl"
sed 's/"loss": 8.0/"loss": 8.0004/' "$WORK/a.jsonl" >"$WORK/b.jsonl"
expect_exit 0 "$PY" "$report" parity "$WORK/a.jsonl" "$WORK/a.jsonl" --steps 3 --rtol 1e-4
expect_output '"max_rel": 0.0'
expect_exit 1 "$PY" "$report" parity "$WORK/a.jsonl" "$WORK/b.jsonl" --steps 3 --rtol 1e-5
expect_output '"ok": false'
expect_exit 1 "$PY" "$report" parity "$WORK/a.jsonl" "$WORK/a.jsonl" --steps 4
expect_output '"missing_steps": \[4\]'
expect_exit 0 "$PY" "$report" speed "$WORK/a.jsonl" --warmup 1 --tokens-per-step 1000
# Steps 2 and 3 in 4 s: 500 tokens/s; 2e10 FLOPs per token; MFU against the 5 TFLOP/s implied.
expect_output '"tokens_per_s": 500.0'
expect_output '"tflops": 10.0'
expect_output '"mfu": 200.0'

# Without a GPU the check stops at once, with exit 2 and a message naming the fix.
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  expect_exit 2 env TITAN_PYTHON="$PY" bash scripts/gpu_check.sh --build-dir "$WORK/gpu"
  expect_output "no CUDA device visible"
  expect_output "cpu-dry-run"
  grep -q '| preflight | FAIL |' "$WORK/gpu/gpu_check_summary.md" || fail "no summary row"
fi
expect_exit 2 bash scripts/gpu_check.sh --stages parity,nosuch --build-dir "$WORK/gpu"
expect_output "unknown stage 'nosuch'"

# The default run on the CPU, with the binaries of this build.
build_dir="$(cd "$(dirname "$TITAN")" && pwd)"
start=$SECONDS
# Speed stages as short as they can be (1 warm-up step and 2 timed ones at seq 64): they are
# checked for running and reporting, not for their figures.
expect_exit 0 env TITAN_PYTHON="$PY" GPU_CHECK_SEQ=64 GPU_CHECK_STEPS=2 GPU_CHECK_WARMUP=1 \
  bash scripts/gpu_check.sh --cpu-dry-run --skip-build \
  --build-dir "$build_dir" --work "$WORK/dry" --summary "$WORK/dry.md"
echo "dry run: $((SECONDS - start)) s"
summary="$WORK/dry.md"
grep -q 'CPU DRY RUN: no GPU was used' "$summary" || fail "dry run: no bold CPU note"
grep -q '| build | skipped | 0 | --skip-build' "$summary" || fail "dry run: build row"
for name in unit parity shared_parallel image_models titan_bf16 ref_eager float8 ref_compile; do
  grep -qE "^\| $name \| ok \|" "$summary" || { cat "$summary" >&2; fail "dry run: $name not ok"; }
done
grep -qE '^Shared-CPU parallelism .*fsdp2 [0-9.e+-]+ \(pass\), tp2 [0-9.e+-]+ \(pass\), pp2 [0-9.e+-]+ \(pass\)' \
  "$summary" || { cat "$summary" >&2; fail "dry run: shared-device parities"; }
grep -q 'Measured on the CPU (dry run, no GPU): the CUDA unit tests;' "$summary" ||
  { cat "$summary" >&2; fail "dry run: what was measured where"; }
grep -qE '^\| unit \| ok \| [0-9]+ \| [0-9]+% tests passed.*; [1-9][0-9]* tests ran' "$summary" ||
  { cat "$summary" >&2; fail "dry run: the CUDA unit tests ran no test"; }
cat "$summary"
echo "ok"
