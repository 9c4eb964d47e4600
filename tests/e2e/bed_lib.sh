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
