# Helpers shared by the bench/*.sh scripts (sourced, not run): reading titan's metrics files.
# A metrics file (metrics.jsonl / metrics_rank_<r>.jsonl) holds one JSON object per logged step.

# mean_of FILE KEY [SKIP]: the mean of KEY over the logged steps after the first SKIP (warm-up;
# default 1) in a metrics file; 0 when none is left.
mean_of() {
  local skip="${3:-1}"
  grep "\"$2\":" "$1" | sed -E "s/.*\"$2\":(-?[0-9.eE+-]+).*/\1/" | tail -n +"$((skip + 1))" |
    awk '{ s += $1; n++ } END { printf "%.6g", n ? s / n : 0 }'
}

# last_of FILE KEY: the last value of KEY in a metrics file (memory_gib: peak RSS so far, so the
# run's peak).
last_of() { grep "\"$2\":" "$1" | sed -E "s/.*\"$2\":(-?[0-9.eE+-]+).*/\1/" | tail -n 1; }
