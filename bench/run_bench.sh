#!/usr/bin/env bash
# Training-speed benchmark: titan.cpp vs a PyTorch-eager Python loop on the same machine and
# libtorch, single process, 2 threads, in float32 and bfloat16, for two model sizes:
#   (a) dim 256, 6 layers, 8 heads, 4 kv heads, vocab 8192, seq 256, batch 8   (flavor bench_small)
#   (b) dim 512, 8 layers, 8 heads, vocab 32000, seq 512, batch 4              (flavor bench_medium)
# Each variant runs in its own process so peak RSS belongs to it. Prints tokens/s, MFU, peak RSS
# and the titan/reference ratios. The reference runs twice: as a user gets it (glibc defaults) and
# with the same heap settings titan applies at start-up (configure_cpu_allocator, via glibc's
# MALLOC_* tunables), so the second ratio isolates what is not the allocator.
# A benchmark, not a test: it never fails on speed.
#   bench/run_bench.sh [STEPS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps="${1:-10}"
threads="${THREADS:-2}"
titan="$root/build/titan"
[ -x "$titan" ] || bash "$root/scripts/setup.sh"
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get install -y -qq python3-torch >/dev/null
fi

field() { sed -E "s/.*[ ^]$1=([^ ]+).*/\1/" <<< "$2"; }

printf '%-5s %-9s %11s %10s %6s %13s %6s %9s %9s %8s\n' case dtype titan_tok/s ref_tok/s ratio \
  ref_heap_tok/s ratio titan_mfu titan_GiB ref_GiB
for case in a b; do
  if [ $case = a ]; then
    flavor=bench_small; batch=8; seq=256; ref=(--dim 256 --layers 6 --heads 8 --kv-heads 4 --vocab 8192)
  else
    flavor=bench_medium; batch=4; seq=512; ref=(--dim 512 --layers 8 --heads 8 --kv-heads 8 --vocab 32000)
  fi
  for dtype in float32 bfloat16; do
    t=$("$titan" bench --model.flavor $flavor --training.local_batch_size $batch \
        --training.seq_len $seq --training.mixed_precision_param $dtype --training.steps "$steps" \
        --training.num_threads "$threads" | grep '^bench ')
    r=$(/usr/bin/python3 "$root/bench/reference_train.py" "${ref[@]}" --seq $seq --batch $batch \
        --dtype $dtype --steps "$steps" --threads "$threads" | grep '^reference ')
    h=$(MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483647 \
        MALLOC_TOP_PAD_=1073741824 /usr/bin/python3 "$root/bench/reference_train.py" "${ref[@]}" \
        --seq $seq --batch $batch --dtype $dtype --steps "$steps" --threads "$threads" |
        grep '^reference ')
    tt=$(field tokens_per_s "$t"); rt=$(field tokens_per_s "$r"); ht=$(field tokens_per_s "$h")
    printf '%-5s %-9s %11.1f %10.1f %6.2f %13.1f %6.2f %8.2f%% %9.3f %8.3f\n' "$case" $dtype \
      "$tt" "$rt" "$(awk -v a="$tt" -v b="$rt" 'BEGIN{print a/b}')" \
      "$ht" "$(awk -v a="$tt" -v b="$ht" 'BEGIN{print a/b}')" "$(field mfu_pct "$t")" \
      "$(field peak_rss_gib "$t")" "$(field peak_rss_gib "$r")"
  done
done
