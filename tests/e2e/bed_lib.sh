# The two-host test bed (sourced after parallel_lib.sh): two network namespaces joined by veth
# pairs on a bridge, each with its own address and its own loopback, so that a process bound to
# 127.0.0.1 on one "host" cannot be reached from the other, as on real machines. Host i is the
# namespace ${ns[i]} with the address ${addr[i]}; run a command there with on_host I CMD...
# Needs root (network namespaces, CAP_NET_ADMIN), iproute2 and nftables (scripts/setup.sh
# installs them). Everything made here is removed on exit, also on failure.

command -v ip >/dev/null || fail "iproute2's ip is missing (scripts/setup.sh installs it)"
command -v nft >/dev/null || fail "nftables' nft is missing (scripts/setup.sh installs it)"
[ "$(id -u)" -eq 0 ] || fail "network namespaces need root"

tag=$(($$ % 10000))
bridge="tbr$tag"
ns=("tns${tag}a" "tns${tag}b")
addr=(10.231.0.1 10.231.0.2)
bed_cleanup() {
  for n in "${ns[@]}"; do ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
  for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$WORK"
}
trap bed_cleanup EXIT

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

# on_host I CMD...: runs CMD on host I (in its namespace).
on_host() {
  local i="$1"; shift
  ip netns exec "${ns[$i]}" "$@"
}

# signal_host SIGNAL I: sends SIGNAL to every process on host I, as when the host fails
# (SIGKILL) or stops (SIGSTOP; SIGCONT resumes it).
signal_host() {
  ip netns pids "${ns[$2]}" | xargs -r kill "-$1"
}

# delay_link MS [sender]: every packet between the hosts waits MS ms more, each way. The delay
# sits where a real link's does, after the sending host: netem on the bridge's ports where the
# kernel has it; else (these VMs' kernels lack sch_netem) tests/tools/netdelay on each host's
# input (an NFQUEUE), at real-time priority so that busy cores do not stretch it. With "sender",
# host 1's packets are held on host 1 both ways instead, as this bed once did: TCP then counts
# them as still queued in the sending host (TCP Small Queues, we believe), which caps a host-1
# sender at about two packets per delay, 1 MB/s at 5 ms: an artifact, kept to measure it.
# undelay_link takes the delay away.
delay_how=
delay_pids=()
delay_link() {
  local at="${2:-link}" netdelay rt=() i
  if [ "$at" = link ] && tc qdisc add dev "tv${tag}h0" root netem delay "${1}ms" 2>/dev/null; then
    tc qdisc add dev "tv${tag}h1" root netem delay "${1}ms"
    delay_how=netem
    return 0
  fi
  netdelay="$(dirname "$TITAN")/netdelay"
  [ -x "$netdelay" ] || fail "no netem in this kernel and no $netdelay (the build makes it when" \
    "libnetfilter-queue-dev is installed: scripts/setup.sh)"
  command -v iptables >/dev/null || fail "iptables is missing (scripts/setup.sh installs it)"
  chrt -f 20 true 2>/dev/null && rt=(chrt -f 20)
  local hosts=(0 1)
  [ "$at" = sender ] && hosts=(1)
  delay_pids=()
  for i in "${hosts[@]}"; do
    ip netns exec "${ns[$i]}" "${rt[@]}" "$netdelay" 0 "$1" >"$WORK/netdelay$i.out" \
      2>"$WORK/netdelay$i.err" &
    delay_pids+=($!)
    for _ in $(seq 1 50); do grep -q ready "$WORK/netdelay$i.out" && break; sleep 0.1; done
    grep -q ready "$WORK/netdelay$i.out" || { cat "$WORK/netdelay$i.err" >&2; fail "netdelay did not start"; }
    ip netns exec "${ns[$i]}" iptables -A INPUT -i eth0 -j NFQUEUE --queue-num 0 --queue-bypass
  done
  [ "$at" = sender ] &&
    ip netns exec "${ns[1]}" iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0 --queue-bypass
  delay_how="netdelay ($at)"
}
undelay_link() {
  local i
  if [ "$delay_how" = netem ]; then
    tc qdisc del dev "tv${tag}h0" root
    tc qdisc del dev "tv${tag}h1" root
  elif [ -n "$delay_how" ]; then
    for i in 0 1; do
      ip netns exec "${ns[$i]}" iptables -F INPUT
      ip netns exec "${ns[$i]}" iptables -F OUTPUT
    done
    kill "${delay_pids[@]}"
    wait "${delay_pids[@]}" || true
  fi
  delay_how=
}
