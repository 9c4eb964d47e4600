#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by veth pairs on a bridge, each with
# its own address and its own loopback, so a rank that binds to 127.0.0.1 (or to a host name
# that resolves there) cannot be reached from the other "host", as on real machines. One
# `titan run --nnodes 2 --node_rank i --master_addr <host 0>` per namespace:
#   - Gloo without GLOO_SOCKET_IFNAME binds where the route to the master leaves (it used to take
#     the host name, i.e. loopback here, and the job failed to connect);
#   - GLOO_SOCKET_IFNAME names the interface explicitly;
#   - FSDP over 2 hosts x 2 ranks reproduces the one-process loss curve (parallel_lib.sh's run,
#     within 1e-5 relative), and its checkpoint resumes on one host.
# Needs root (network namespaces, CAP_NET_ADMIN) and iproute2 (scripts/setup.sh installs it).
# Everything made here is removed on exit, also on failure.
source "$(dirname "${BASH_SOURCE[0]}")/parallel_lib.sh"

command -v ip >/dev/null || fail "iproute2's ip is missing (scripts/setup.sh installs it)"
[ "$(id -u)" -eq 0 ] || fail "network namespaces need root"

tag=$(($$ % 10000))
bridge="tbr$tag"
ns=("tns${tag}a" "tns${tag}b")
addr=(10.231.0.1 10.231.0.2)
cleanup() {
  for n in "${ns[@]}"; do ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
  for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

ip link add "$bridge" type bridge || fail "cannot create a bridge (network namespaces need CAP_NET_ADMIN)"
ip link set "$bridge" up
for i in 0 1; do
  ip netns add "${ns[$i]}"
  ip link add "tv${tag}h$i" type veth peer name "tv${tag}n$i"
  ip link set "tv${tag}h$i" master "$bridge" up
  ip link set "tv${tag}n$i" netns "${ns[$i]}"
  ip -n "${ns[$i]}" link set "tv${tag}n$i" name eth0
  ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev eth0
  ip -n "${ns[$i]}" link set eth0 up
  ip -n "${ns[$i]}" link set lo up
done

port() { echo $((20000 + RANDOM % 20000)); }

# on_hosts NAME NPROC [ENV=VALUE...] -- ARGS...: one `titan run` per namespace (node 1 in the
# background), outputs in $WORK/NAME.node{0,1}; fails unless both exit 0.
on_hosts() {
  local name="$1" nproc="$2"; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local p; p=$(port)
  local pids=()
  for node in 1 0; do
    ip netns exec "${ns[$node]}" env "${envs[@]}" LOG_RANK=all timeout 300 "$TITAN" run \
      --nnodes 2 --node_rank $node --master_addr "${addr[0]}" --master_port "$p" \
      --nproc_per_node "$nproc" -- "$@" >"$WORK/$name.node$node" 2>&1 &
    pids[$node]=$!
  done
  local bad=0
  for node in 0 1; do wait "${pids[$node]}" || bad=1; done
  if [ $bad = 1 ]; then
    tail -n 20 "$WORK/$name.node0" "$WORK/$name.node1" >&2
    fail "$name: a node failed"
  fi
}

# --- the default interface: where the route to the master leaves ---
on_hosts route 1 GLOO_SOCKET_IFNAME= -- selftest
grep -q '^\[rank 1\] .*selftest passed (rank 1 of 2)' "$WORK/route.node1" ||
  fail "route: rank 1 on the second host did not pass"
echo "two hosts, no GLOO_SOCKET_IFNAME: selftest passed"

# --- GLOO_SOCKET_IFNAME ---
on_hosts ifname 1 GLOO_SOCKET_IFNAME=eth0 -- selftest
grep -q '^\[rank 1\] .*selftest passed (rank 1 of 2)' "$WORK/ifname.node1" ||
  fail "ifname: rank 1 on the second host did not pass"
echo "two hosts, GLOO_SOCKET_IFNAME=eth0: selftest passed"

# --- FSDP over 2 hosts x 2 ranks against one process ---
one=(--training.local_batch_size 8 --validation.local_batch_size 4)
train single 1 "${one[@]}"
on_hosts fsdp 2 GLOO_SOCKET_IFNAME= -- train "${common[@]}" --job.dump_folder "$WORK/fsdp" \
  --training.local_batch_size 2 --validation.local_batch_size 1
grep -q 'FSDP: sharded over 4 ranks' "$WORK/fsdp.node0" || fail "fsdp: not sharded over 4 ranks"
same_losses single fsdp loss
same_losses single fsdp validation_loss
same_params single fsdp
# The checkpoint written by the two hosts (4 ranks) resumes in one process.
resume_from fsdp 5 fsdp_resumed 1 "${one[@]}"
echo "multihost: all cases passed"
