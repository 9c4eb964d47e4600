#!/usr/bin/env bash
# Training across two hosts a few milliseconds apart, on the two-host bed of tests/e2e/bed_lib.sh
# (root; network namespaces): the step time of FSDP over 2 hosts x 2 ranks (debugmodel_narrow,
# seq 64, 8 sequences per step) with 0 / 1 / 2 / 5 ms added each way, and of DiLoCo replica groups
# (one per host, FSDP 2 inside, a sync every 20 steps), as ratios to the clean link. Each delay is
# applied two ways: on the link (where a real link delays: netem on the bridge, or netdelay on
# each host's input) and "sender" (host 1's packets held on host 1 both ways, as the bed did
# before: TCP Small Queues then caps a host-1 sender at about two packets per delay). Prints;
# never fails on speed.
#
#   bash bench/latency_bench.sh build/titan
source "$(dirname "${BASH_SOURCE[0]}")/../tests/e2e/parallel_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../tests/e2e/bed_lib.sh"

# seconds_per_step NAME: group/node 0's training time over its steps.
seconds_per_step() {
  sed -nE 's/.*training done: ([0-9]+) steps in ([0-9.]+)s.*/\2 \1/p' "$WORK/$1" |
    awk '{ printf "%.3f", $1 / $2 }'
}

# fsdp NAME STEPS: FSDP 4 over the two hosts.
fsdp() {
  local p pids=()
  p=$(port)
  for node in 1 0; do
    on_host "$node" env GLOO_SOCKET_IFNAME= timeout 900 "$TITAN" run --nnodes 2 --node_rank "$node" \
      --master_addr "${addr[0]}" --master_port "$p" --nproc_per_node 2 -- train "${common[@]}" \
      --training.local_batch_size 2 --training.steps "$2" --validation.enable false \
      --checkpoint.enable false --job.dump_folder "$WORK/$1.dump" >"$WORK/$1.n$node" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}" || { tail -n 20 "$WORK/$1.n0" "$WORK/$1.n1" >&2; fail "$1 failed"; }
  cp "$WORK/$1.n0" "$WORK/$1"
}

# diloco NAME: two replica groups, one per host, 60 steps, a sync every 20.
diloco() {
  local lp= pids=()
  on_host 0 "$TITAN" ft lighthouse --port 0 --min_replicas 2 >"$WORK/$1.lighthouse" 2>&1 &
  local lh=$!
  while [ -z "$lp" ]; do
    sleep 0.1
    lp=$(sed -nE 's/.*listening on port ([0-9]+).*/\1/p' "$WORK/$1.lighthouse")
  done
  for i in 0 1; do
    on_host "$i" env TITAN_FT_LIGHTHOUSE="${addr[0]}:$lp" timeout 900 "$TITAN" run \
      --nproc_per_node 2 --master_port "$(port)" -- train "${common[@]}" \
      --training.local_batch_size 2 --training.global_batch_size 4 --training.steps 60 \
      --validation.enable false --checkpoint.enable false --fault_tolerance.enable \
      --fault_tolerance.group_size 2 --fault_tolerance.replica_id "$i" \
      --fault_tolerance.semi_sync_method diloco --fault_tolerance.sync_steps 20 \
      --job.dump_folder "$WORK/$1.$i" >"$WORK/$1.g$i" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}" || { tail -n 20 "$WORK/$1.g0" "$WORK/$1.g1" >&2; fail "$1 failed"; }
  kill "$lh"
  wait "$lh" || true
  cp "$WORK/$1.g0" "$WORK/$1"
}

fsdp fsdp_0 10
diloco diloco_0
base_fsdp=$(seconds_per_step fsdp_0)
base_diloco=$(seconds_per_step diloco_0)
printf "%-22s %12s %8s %14s %8s\n" "delay each way" "FSDP s/step" "ratio" "DiLoCo s/step" "ratio"
printf "%-22s %12s %8s %14s %8s\n" "0 ms" "$base_fsdp" "1.00" "$base_diloco" "1.00"
for at in link sender; do
  for ms in 1 2 5; do
    delay_link "$ms" "$at"
    steps=10
    [ "$at" = sender ] && [ "$ms" -ge 2 ] && steps=3  # several seconds a step
    fsdp "fsdp_${at}_$ms" "$steps"
    diloco "diloco_${at}_$ms"
    undelay_link
    f=$(seconds_per_step "fsdp_${at}_$ms") d=$(seconds_per_step "diloco_${at}_$ms")
    printf "%-22s %12s %8s %14s %8s\n" "$ms ms ($at)" "$f" \
      "$(awk -v a="$f" -v b="$base_fsdp" 'BEGIN { printf "%.2f", a / b }')" "$d" \
      "$(awk -v a="$d" -v b="$base_diloco" 'BEGIN { printf "%.2f", a / b }')"
  done
done
