#!/usr/bin/env bash
# titan against PyTorch over whole runs, first steps included, in alternating rounds: each round
# runs every variant once per model, in turn, so a busy spell of a shared machine hits all of
# them alike; the ratios are taken within a round and summarised over the rounds (median, range).
# Variants (float32 by default, 2 threads, no activation checkpointing, as bench/run_bench.sh):
#   titan    `titan bench` as the default run trains (titan's measured CPU kernels)
#   aten     the same with TITAN_CPU_KERNELS=aten (ATen's compositions only)
#   fused    --compile.enable (adds the fused linear + cross-entropy)
#   eager    bench/reference_train.py, titan's heap settings
#   compile  the same loop through torch.compile (its inductor cache is warm after round 1; the
#            whole-run figure of round 1 includes the compilation, later ones the cache's load)
# For each variant: "run" = tokens/s over every step (2 warm-up + STEPS), "steady" = over the
# STEPS after the warm-up, and "first" = the first step's time over the steady step time.
#   bench/step_ratio.sh                          # ROUNDS=3 STEPS=10, models (a) and (b)
#   ROUNDS=5 STEPS=20 CASES=a DTYPES=float32 bench/step_ratio.sh
# A benchmark, not a test: it prints figures and never fails on speed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${ROUNDS:-3}"
steps="${STEPS:-10}"
threads="${THREADS:-2}"
titan="$root/build/titan"
[ -x "$titan" ] || bash "$root/scripts/setup.sh"
py="$(bash "$root/scripts/python_env.sh")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
heap=(MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483647
  MALLOC_TOP_PAD_=1073741824)
variants=(${VARIANTS:-titan aten fused eager compile})

# run OUT CMD...: one variant's run, its result line appended to OUT; on failure its log and stop.
run() {
  local out="$1"; shift
  if ! "$@" >"$work/last.out" 2>"$work/last.log"; then
    echo "error: failed: $*" >&2; tail -n 30 "$work/last.log" >&2; exit 1
  fi
  grep -E "^(bench|reference) " "$work/last.out" >>"$out"
}

echo "# $rounds rounds of $steps steps after 2 warm-up steps, $threads threads, $(nproc) cores"
for round in $(seq 1 "$rounds"); do
  for case in ${CASES:-a b}; do
    if [ "$case" = a ]; then
      flavor=bench_small; batch=8; seq=256
      ref=(--dim 256 --layers 6 --heads 8 --kv-heads 4 --vocab 8192)
    else
      flavor=bench_medium; batch=4; seq=512
      ref=(--dim 512 --layers 8 --heads 8 --kv-heads 8 --vocab 32000)
    fi
    for dtype in ${DTYPES:-float32}; do
      common=(bench --model.flavor "$flavor" --activation_checkpoint.mode none
        --training.local_batch_size "$batch" --training.seq_len "$seq"
        --training.mixed_precision_param "$dtype" --training.steps "$steps"
        --training.num_threads "$threads")
      reference=("$py" "$root/bench/reference_train.py" "${ref[@]}" --seq "$seq"
        --batch "$batch" --steps "$steps" --threads "$threads" --dtype "$dtype")
      for v in "${variants[@]}"; do
        out="$work/$case-$dtype-$v.txt"
        case "$v" in
          titan) run "$out" "$titan" "${common[@]}" ;;
          aten) run "$out" env TITAN_CPU_KERNELS=aten "$titan" "${common[@]}" ;;
          fused) run "$out" "$titan" "${common[@]}" --compile.enable ;;
          eager) run "$out" env "${heap[@]}" "${reference[@]}" ;;
          compile)
            run "$out" env "${heap[@]}" TORCHINDUCTOR_CACHE_DIR="$work/inductor-$case-$dtype" \
              "${reference[@]}" --compile ;;
          *) echo "unknown variant $v" >&2; exit 2 ;;
        esac
      done
    done
  done
done

"$py" - "$work" "$steps" <<'EOF'
import glob, os, statistics, sys

work, steps = sys.argv[1], int(sys.argv[2])

def times(line):
    field = [f for f in line.split() if f.startswith("step_times=")][0]
    return [float(t) for t in field.split("=", 1)[1].split(",")]

def figures(line):
    t = times(line)
    tokens = int([f for f in line.split() if f.startswith("batch=")][0].split("=")[1]) * \
        int([f for f in line.split() if f.startswith("seq=")][0].split("=")[1])
    steady = t[-steps:]
    return {"run": tokens * len(t) / sum(t), "steady": tokens * len(steady) / sum(steady),
            "first": t[0] / (sum(steady) / len(steady))}

rows = {}
for path in sorted(glob.glob(os.path.join(work, "*.txt"))):
    case, dtype, variant = os.path.basename(path)[:-4].split("-")
    rows.setdefault((case, dtype), {})[variant] = [figures(l) for l in open(path) if l.strip()]

def summary(values, fmt):
    values = sorted(values)
    return f"{fmt % statistics.median(values)} ({fmt % values[0]}-{fmt % values[-1]})"

pairs = [("titan", "eager"), ("aten", "eager"), ("fused", "compile"), ("fused", "eager"),
         ("titan", "aten")]
for (case, dtype), by in sorted(rows.items()):
    print(f"\n## model ({case}), {dtype}: tokens/s median (min-max) over rounds")
    for v, runs in by.items():
        print(f"  {v:8s} run {summary([r['run'] for r in runs], '%.0f'):22s}"
              f" steady {summary([r['steady'] for r in runs], '%.0f'):22s}"
              f" first step / steady step {summary([r['first'] for r in runs], '%.2f')}")
    for a, b in pairs:
        if a not in by or b not in by:
            continue
        for what in ("run", "steady"):
            ratios = [x[what] / y[what] for x, y in zip(by[a], by[b])]
            print(f"  {a}/{b} {what:6s} {summary(ratios, '%.3f')}")
EOF
