#!/usr/bin/env bash
# titan's FSDP next to PyTorch's own FSDP2 (bench/fsdp2_reference.py under torchrun, Gloo) across
# the two-host bed of tests/e2e/bed_lib.sh (root; network namespaces): FSDP over 2 hosts x 2 ranks,
# debugmodel_narrow, float32, seq 64, 2 sequences per rank, with 0 / 1 / 2 / 5 ms added each way on
# the link (and 0 ms through the delay program, "0q"). Per run: the median step time (steps 4 on),
# its ratio to the clean link, and the step's growth in units of the added one-way delay
# ("delays/step": how many one-way trips wait on one another in a step; a Gloo op is at least a
# round trip, two). At 0 ms also the communication ops per step (titan: metrics.jsonl's comm_ops;
# PyTorch: the Gloo ops its profiler sees in one step) and the packets per step on the link (host
# 0's interface, the difference between a 20-step and a 10-step run); at each delay, single Gloo
# ops timed. Extra titan variants compare settings in the same run, and
# TITAN_BEFORE=path/to/an/older/titan adds a "before" column run by that binary:
#
#   bash bench/fsdp_latency_bench.sh build/titan
#   TITAN_VARIANTS="prefetch2=--parallelism.fsdp_prefetch_units 2" bash bench/fsdp_latency_bench.sh build/titan
#
# Prints; never fails on speed.
source "$(dirname "${BASH_SOURCE[0]}")/../tests/e2e/parallel_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../tests/e2e/bed_lib.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${TITAN_PYTHON:-$(cd "$ROOT" && scripts/python_env.sh --print)}"
TORCHRUN="$(dirname "$PY")/torchrun"
[ -x "$TORCHRUN" ] || fail "no torchrun next to $PY (scripts/python_env.sh installs torch)"
# "0q": no delay, but every packet through the delay program all the same (what it costs per
# packet on a busy 2-core machine is then in the baseline, not in the latency's effect).
DELAYS=(${DELAYS:-0 0q 1 2 5})

# Variants: "name=titan args" separated by ";" (the base run is "titan").
variants=("titan=")
[ -n "${TITAN_BEFORE:-}" ] && variants=("before=" "titan=")
IFS=';' read -r -a extra <<<"${TITAN_VARIANTS:-}"
for v in "${extra[@]}"; do [ -n "$v" ] && variants+=("$v"); done

host0_packets() {
  on_host 0 awk '/eth0:/ { sub(/.*eth0:/, ""); print $2 + $10 }' /proc/net/dev
}

# titan_fsdp NAME STEPS ARGS...: FSDP 4 over the two hosts; median step time of steps 4 on.
titan_fsdp() {
  local name="$1" steps="$2" p pids=() bin="$TITAN"
  shift 2
  [[ "$name" == before* || "$name" == pk_before* ]] && bin="$TITAN_BEFORE"
  p=$(port)
  for node in 1 0; do
    on_host "$node" env GLOO_SOCKET_IFNAME=eth0 timeout 900 "$bin" run --nnodes 2 \
      --node_rank "$node" --master_addr "${addr[0]}" --master_port "$p" --nproc_per_node 2 -- \
      train "${common[@]}" --training.local_batch_size 2 --training.steps "$steps" \
      --validation.enable false --checkpoint.enable false --job.dump_folder "$WORK/$name" \
      "$@" >"$WORK/$name.n$node" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}" || { tail -n 20 "$WORK/$name.n0" "$WORK/$name.n1" >&2; fail "$name failed"; }
}
titan_step_s() {
  sed -nE 's/.*"step":([0-9]+).*/\1 &/p' "$WORK/$1/metrics.jsonl" |
    sed -nE 's/^([0-9]+) .*"time_metrics\/end_to_end\(s\)":([0-9.eE+-]+).*/\1 \2/p' |
    awk '$1 >= 4 { print $2 }' | sort -g | awk '{ v[NR] = $1 } END { printf "%.3f", v[int((NR + 1) / 2)] }'
}
titan_comm_ops() {
  sed -nE 's/.*"comm_ops":([0-9]+).*/\1/p' "$WORK/$1/metrics.jsonl" | tail -n 1
}

# torch_fsdp NAME STEPS [--op-latency]: PyTorch FSDP2, the same layout; 3 warm-up steps and one
# profiled first. With --op-latency: single Gloo ops timed instead (fsdp2_reference.py).
torch_fsdp() {
  local name="$1" steps="$2" p pids=()
  shift 2
  p=$(port)
  for node in 1 0; do
    on_host "$node" env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 timeout 900 "$TORCHRUN" \
      --nnodes 2 --node_rank "$node" --master_addr "${addr[0]}" --master_port "$p" \
      --nproc_per_node 2 "$ROOT/bench/fsdp2_reference.py" --flavor debugmodel_narrow --seq 64 \
      --batch 2 --steps "$steps" --json "$WORK/$name.json" "$@" >"$WORK/$name.n$node" 2>&1 &
    pids+=($!)
  done
  if ! wait "${pids[@]}"; then
    # torchrun's multi-node exit barrier sometimes loses its store as node 0 ends first: once more.
    [ -z "${TORCH_RETRY:-}" ] || { tail -n 20 "$WORK/$name.n0" "$WORK/$name.n1" >&2; fail "$name failed"; }
    echo "$name failed; running it again" >&2
    TORCH_RETRY=1 torch_fsdp "$name" "$steps" "$@"
  fi
}
torch_field() {
  "$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); print($2)" "$WORK/$1.json"
}

# packets_per_step KIND VARIANT_ARGS...: (packets of 20 steps - packets of 10 steps) / 10.
packets_per_step() {
  local kind="$1" before after n10 n20
  shift
  for steps in 10 20; do
    before=$(host0_packets)
    if [ "$kind" = torch ]; then torch_fsdp "pk_torch_$steps" "$steps"
    else titan_fsdp "pk_${kind}_$steps" "$steps" "$@"; fi
    after=$(host0_packets)
    [ "$steps" = 10 ] && n10=$((after - before)) || n20=$((after - before))
  done
  echo $(((n20 - n10) / 10))
}

declare -A secs
for d in "${DELAYS[@]}"; do
  [ "$d" = 0 ] || delay_link "${d%q}"
  for v in "${variants[@]}"; do
    name="${v%%=*}" args="${v#*=}"
    titan_fsdp "${name}_$d" 15 $args
    secs["$name,$d"]=$(titan_step_s "${name}_$d")
  done
  torch_fsdp "torch_$d" 12
  secs["torch,$d"]=$(torch_field "torch_$d" '"%.3f" % r["step_s"]')
  torch_fsdp "ops_$d" 0 --op-latency
  [ "$d" = 0 ] || undelay_link
done

echo "FSDP over 2 hosts x 2 ranks, debugmodel_narrow float32, seq 64, 2 sequences per rank"
printf "%-28s" "delay each way"
for v in "${variants[@]}" "torch=PyTorch FSDP2"; do
  printf "%26s" "${v%%=*} s/step (ratio)"
done
echo
for d in "${DELAYS[@]}"; do
  label="$d ms"
  [ "$d" = 0q ] && label="0 ms, through the delay"
  printf "%-28s" "$label"
  for v in "${variants[@]}" "torch="; do
    n="${v%%=*}"
    printf "%26s" "${secs[$n,$d]} ($(awk -v a="${secs[$n,$d]}" -v b="${secs[$n,0]}" \
      'BEGIN { printf "%.2f", a / b }'))"
  done
  echo
done
# The step's growth per ms of delay: 0 -> 5 ms, and from 0 ms through the delay program ("0q") or
# from 2 ms to 5 ms (both without what the delaying itself costs per packet).
for span in "0 5" "0q 5" "2 5"; do
  set -- $span
  [ -n "${secs[titan,$1]:-}" ] && [ -n "${secs[titan,$2]:-}" ] || continue
  printf "%-28s" "delays/step ($1 -> $2 ms)"
  for v in "${variants[@]}" "torch="; do
    n="${v%%=*}"
    printf "%26s" "$(awk -v a="${secs[$n,$2]}" -v b="${secs[$n,$1]}" -v ms="$(($2 - ${1%q}))" \
      'BEGIN { printf "%.0f", (a - b) / (ms / 1000) }')"
  done
  echo
done
printf "%-28s" "comm ops/step"
for v in "${variants[@]}"; do printf "%26s" "$(titan_comm_ops "${v%%=*}_0")"; done
printf "  %s\n" "$(torch_field torch_0 'r["gloo_ops_total"], r["gloo_ops_per_step"]' | tr -d ' ')"
printf "%-28s" "packets/step (host 0)"
for v in "${variants[@]}"; do
  printf "%26s" "$(packets_per_step "${v%%=*}" ${v#*=})"
done
printf "%26s\n" "$(packets_per_step torch)"
echo
echo "Single Gloo ops across the hosts (PyTorch's Gloo, rank 0's mean of 10; ms)"
printf "%-40s" "op"
for d in "${DELAYS[@]}"; do printf "%12s" "${d/q/q} ms"; done
echo
"$PY" - "$WORK" "${DELAYS[@]}" <<'PY'
import json, sys
work, delays = sys.argv[1], sys.argv[2:]
runs = [json.load(open(f"{work}/ops_{d}.json"))["op_ms"] for d in delays]
for op in runs[0]:
    print(f"{op:<40}" + "".join(f"{r[op]:12.1f}" for r in runs))
PY
