#!/usr/bin/env bash
# Training-speed benchmark: titan.cpp against PyTorch 2.15 (the torch whose libtorch titan links,
# from the project's Python environment, scripts/python_env.sh) running the same model in a Python
# loop, eagerly and through torch.compile (inductor, C++ kernels on the CPU). Single process,
# THREADS threads (default 2), float32 and bfloat16, two model sizes:
#   (a) dim 256, 6 layers, 8 heads, 4 kv heads, vocab 8192, seq 256, batch 8   (flavor bench_small)
#   (b) dim 512, 8 layers, 8 heads, vocab 32000, seq 512, batch 4              (flavor bench_medium)
# Variants, each in its own process so that peak RSS belongs to it:
#   titan        `titan bench` (which sets its heap up at start, configure_cpu_allocator)
#   fused        the same with titan's fused kernels (--compile.enable: components model and
#                loss, i.e. the layers' kernels and the fused linear + cross-entropy)
#   eager_glibc  bench/reference_train.py with glibc's default heap, as a user gets it
#   eager        the same loop with titan's heap settings, given through glibc's MALLOC_* tunables
#   compile      the loop with torch.compile (forward + loss with its backward, and clip + AdamW),
#                titan's heap settings; compilation happens in warm-up steps, untimed, and is
#                reported as compile_s (with a fresh inductor cache, i.e. a first run's cost)
# Prints tokens/s, titan's and fused titan's ratios to the references, MFU, compile s, peak RSS.
# A benchmark, not a test: it never fails on speed.
#   bench/run_bench.sh [STEPS]        STEPS (default 10) may also come from the environment
#   THREADS=2 BENCH_QUICK=1 STEPS=2 bench/run_bench.sh  # smoke test: seq 64 for both models
#   INDUCTOR_CACHE=DIR bench/run_bench.sh               # keep compiled kernels in DIR (warm reruns)
#   DTYPES=float32 CASES=b bench/run_bench.sh           # some of the rows (default: all)
# On a CPU without AVX-512 PyTorch runs bf16 matmuls in ATen's generic loop (about 1 GFLOP/s on
# 2 cores: one step of model (a) takes minutes), so the bf16 reference columns take hours there;
# DTYPES=float32 leaves them out.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps="${1:-${STEPS:-10}}"
threads="${THREADS:-2}"
titan="$root/build/titan"
[ -x "$titan" ] || bash "$root/scripts/setup.sh"
py="$(bash "$root/scripts/python_env.sh")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# torch.compile on the CPU compiles C++ with g++ (or $CXX) against Python.h of the interpreter
# the environment was made from. g++ comes with scripts/setup.sh (build-essential); Python.h is
# installed from Debian's python3-dev when that interpreter is Debian's, else the compile column
# is left out with a note.
compile_ok=1
[ -n "$(command -v "${CXX:-g++}")" ] || bash "$root/scripts/setup.sh"
has_python_h() { "$py" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("include"), "Python.h")))'; }
if ! has_python_h; then
  base="$("$py" -c 'import os, sys; print(os.path.realpath(sys._base_executable))')"
  if [[ "$base" == /usr/bin/* ]]; then
    sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq python3-dev >/dev/null
  fi
  has_python_h || {
    compile_ok=0
    echo "note: no Python.h for $base, so torch.compile cannot build its kernels; compile" \
      "column skipped. HINT: install that interpreter's development headers" >&2
  }
fi

heap=(MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483647
  MALLOC_TOP_PAD_=1073741824)

# field KEY LINE: the value of KEY=value in LINE, or - when absent.
field() { local v; v=$(grep -o " $1=[^ ]*" <<< "$2" | cut -d= -f2) || true; echo "${v:--}"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b; else print "-" }'; }

# run NAME PREFIX CMD...: runs one variant, prints its line starting with PREFIX; on failure shows
# its log and stops.
run() {
  local name="$1" prefix="$2"; shift 2
  if ! "$@" >"$work/$name.out" 2>"$work/$name.log"; then
    echo "error: $name failed: $*" >&2; tail -n 30 "$work/$name.log" >&2; exit 1
  fi
  grep "^$prefix " "$work/$name.out"
}

echo "# $steps timed steps after warm-up, $threads threads, $(nproc) cores; PyTorch" \
  "$("$py" -c 'import torch; print(torch.__version__)')${BENCH_QUICK:+; BENCH_QUICK: seq 64}"
fmt='%-4s %-8s %9s %9s %11s %9s %9s %8s %8s %8s %8s %8s %7s %7s %8s %7s %7s %7s %7s\n'
printf "$fmt" case dtype titan fused eager_glibc eager compile t/glibc t/eager t/comp f/eager \
  f/comp t_mfu f_mfu compile_s t_GiB f_GiB e_GiB c_GiB
for case in ${CASES:-a b}; do
  if [ $case = a ]; then
    flavor=bench_small; batch=8; seq=256
    ref=(--dim 256 --layers 6 --heads 8 --kv-heads 4 --vocab 8192)
  else
    flavor=bench_medium; batch=4; seq=512
    ref=(--dim 512 --layers 8 --heads 8 --kv-heads 8 --vocab 32000)
  fi
  [ -z "${BENCH_QUICK:-}" ] || seq=64
  ref+=(--seq $seq --batch $batch --steps "$steps" --threads "$threads")
  for dtype in ${DTYPES:-float32 bfloat16}; do
    id="$case-$dtype"
    # No activation checkpointing (the job config's default is selective), as the reference.
    t=$(run "$id-titan" bench "$titan" bench --model.flavor $flavor \
        --activation_checkpoint.mode none --training.local_batch_size $batch \
        --training.seq_len $seq --training.mixed_precision_param $dtype --training.steps "$steps" \
        --training.num_threads "$threads")
    f=$(run "$id-fused" bench "$titan" bench --model.flavor $flavor \
        --activation_checkpoint.mode none --training.local_batch_size $batch \
        --training.seq_len $seq --training.mixed_precision_param $dtype --training.steps "$steps" \
        --training.num_threads "$threads" --compile.enable)
    reference=("$py" "$root/bench/reference_train.py" "${ref[@]}" --dtype $dtype)
    g=$(run "$id-eager_glibc" reference "${reference[@]}")
    e=$(run "$id-eager" reference env "${heap[@]}" "${reference[@]}")
    c=""
    if [ $compile_ok = 1 ]; then
      cache="${INDUCTOR_CACHE:-$work/inductor-$id}"
      c=$(run "$id-compile" reference env "${heap[@]}" TORCHINDUCTOR_CACHE_DIR="$cache" \
          "${reference[@]}" --compile)
      [ "$(field recompiles "$c")" = 0 ] ||
        echo "note: $id compile recompiled during the timed steps; raise the warm-up" >&2
    fi
    tt=$(field tokens_per_s "$t"); gt=$(field tokens_per_s "$g"); et=$(field tokens_per_s "$e")
    ct=$(field tokens_per_s "$c"); ft=$(field tokens_per_s "$f")
    printf "$fmt" "$case" $dtype "$tt" "$ft" "$gt" "$et" "$ct" "$(ratio "$tt" "$gt")" \
      "$(ratio "$tt" "$et")" "$(ratio "$tt" "$ct")" "$(ratio "$ft" "$et")" "$(ratio "$ft" "$ct")" \
      "$(field mfu_pct "$t")%" "$(field mfu_pct "$f")%" "$(field compile_s "$c")" \
      "$(field peak_rss_gib "$t")" "$(field peak_rss_gib "$f")" "$(field peak_rss_gib "$e")" \
      "$(field peak_rss_gib "$c")"
  done
done
