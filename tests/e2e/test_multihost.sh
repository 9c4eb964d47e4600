#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by veth pairs on a bridge, each with
# its own address and its own loopback, so a rank that binds to 127.0.0.1 (or to a host name
# that resolves there) cannot be reached from the other "host", as on real machines. One
# `titan run --nnodes 2 --node_rank i --master_addr <host 0>` per namespace:
#   - Gloo without GLOO_SOCKET_IFNAME binds where the route to the master leaves (it used to take
#     the host name, i.e. loopback here, and the job failed to connect);
#   - GLOO_SOCKET_IFNAME names the interface explicitly;
#   - FSDP, HSDP (replicas across the hosts), FSDP x TP (TP inside a host), PP x TP (stages
#     across the hosts), FSDP x CP and, on the MoE model, EP 4 (experts on both hosts) over 2 hosts
#     x 2 ranks reproduce the one-process loss curves (parallel_lib.sh's run, within 1e-5
#     relative); checkpoints written across the hosts resume in one process;
#   - a link that goes down mid-training: both nodes end non-zero within
#     comm.train_timeout_seconds plus the few seconds of the diagnosis, node 0 naming the silent
#     ranks and their host, node 1 the master it lost; the last checkpoint resumes on the hosts
#     with the losses the run had before the fault;
#   - a rank killed on host 1: host 0's ranks end within a second or two (its `titan run` writes
#     why into the store, their heartbeats read it), not at their collectives' timeout;
#   - a degraded link, 1 ms more each way (bed_lib.sh's delay_link) and 1% of the packets lost
#     (nftables): training stays exact, only slower.
# The bed is bed_lib.sh's; without netem this test also needs iptables and the build's netdelay
# (scripts/setup.sh installs them).
source "$(dirname "${BASH_SOURCE[0]}")/parallel_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/bed_lib.sh"

# start_on_hosts NAME NPROC [ENV=VALUE...] -- ARGS...: one `titan run` per namespace in the
# background, outputs in $WORK/NAME.node{0,1}, process ids in node_pid[0..1].
node_pid=()
start_on_hosts() {
  local name="$1" nproc="$2"; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local p; p=$(port)
  for node in 1 0; do
    ip netns exec "${ns[$node]}" env "${envs[@]}" LOG_RANK=all timeout 300 "$TITAN" run \
      --nnodes 2 --node_rank $node --master_addr "${addr[0]}" --master_port "$p" \
      --nproc_per_node "$nproc" -- "$@" >"$WORK/$name.node$node" 2>&1 &
    node_pid[$node]=$!
  done
}

# on_hosts NAME NPROC [ENV=VALUE...] -- ARGS...: start_on_hosts, then fails unless both exit 0.
on_hosts() {
  start_on_hosts "$@"
  local name="$1" bad=0
  for node in 0 1; do wait "${node_pid[$node]}" || bad=1; done
  if [ $bad = 1 ]; then
    tail -n 20 "$WORK/$name.node0" "$WORK/$name.node1" >&2
    fail "$name: a node failed"
  fi
}

# wait_for_step NAME N: until node 0 of the run NAME has logged step N (fails after 120 s).
wait_for_step() {
  for _ in $(seq 1 1200); do
    grep -qE "step: +$2 " "$WORK/$1.node0" 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$WORK/$1.node0" >&2
  fail "$1: no step $2"
}

# wait_nodes: waits for both nodes of the last start_on_hosts; their exit codes go to code[],
# the seconds from now until each ended to elapsed[] (each its own: both are watched).
wait_nodes() {
  local since left=2 node
  since=$(date +%s)
  code=()
  elapsed=()
  while [ $left -gt 0 ]; do
    for node in 0 1; do
      [ -z "${code[$node]:-}" ] || continue
      kill -0 "${node_pid[$node]}" 2>/dev/null && continue
      set +e; wait "${node_pid[$node]}"; code[$node]=$?; set -e
      elapsed[$node]=$(($(date +%s) - since))
      left=$((left - 1))
    done
    sleep 0.2
  done
}

# train_on_hosts NAME ARGS...: parallel_lib.sh's run on 2 hosts x 2 ranks into $WORK/NAME.
train_on_hosts() {
  local name="$1"; shift
  on_hosts "$name" 2 GLOO_SOCKET_IFNAME= -- train "${common[@]}" --job.dump_folder "$WORK/$name" "$@"
  cp "$WORK/$name.node0" "$WORK/$name.log"
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

# --- an interface that cannot carry the job: an error at start-up on both nodes, naming it ---
for bad in lo nosuch0; do
  start_on_hosts "bad_$bad" 1 GLOO_SOCKET_IFNAME=$bad -- selftest
  wait_nodes
  for node in 0 1; do
    [ "${code[$node]}" != 0 ] && [ "${elapsed[$node]}" -le 30 ] ||
      { tail -n 5 "$WORK/bad_$bad.node$node" >&2; fail "GLOO_SOCKET_IFNAME=$bad: node $node"; }
    grep -q "GLOO_SOCKET_IFNAME=$bad: " "$WORK/bad_$bad.node$node" ||
      { tail -n 5 "$WORK/bad_$bad.node$node" >&2; fail "GLOO_SOCKET_IFNAME=$bad: no message"; }
  done
done
grep -q "lo is the loopback interface.*the route to the master leaves from eth0 (${addr[1]}): GLOO_SOCKET_IFNAME=eth0" \
  "$WORK/bad_lo.node1" || { tail -n 5 "$WORK/bad_lo.node1" >&2; fail "GLOO_SOCKET_IFNAME=lo: message"; }
grep -q "this host has no interface nosuch0 with an address (it has eth0 ${addr[0]}, lo 127.0.0.1)" \
  "$WORK/bad_nosuch0.node0" || { tail -n 5 "$WORK/bad_nosuch0.node0" >&2; fail "nosuch0: message"; }
echo "two hosts, GLOO_SOCKET_IFNAME=lo or an unknown interface: refused at start-up, naming it"

# --- FSDP over 2 hosts x 2 ranks against one process ---
one=(--training.local_batch_size 8 --validation.local_batch_size 4)
train single 1 "${one[@]}"
since=$(date +%s%N)
train_on_hosts fsdp --training.local_batch_size 2 --validation.local_batch_size 1
fsdp_took=$(awk -v ns=$(($(date +%s%N) - since)) 'BEGIN { printf "%.1f", ns / 1e9 }')
grep -q 'FSDP: sharded over 4 ranks' "$WORK/fsdp.log" || fail "fsdp: not sharded over 4 ranks"
# The checkpoint written by the two hosts (4 ranks) resumes in one process.
resume_from fsdp 5 fsdp_resumed 1 "${one[@]}"

# --- the other parallelisms across the hosts (mesh pp, dp_replicate, dp_shard, cp, tp: the
# innermost dimension stays inside a host, the outermost spans them) ---
train_on_hosts hsdp --parallelism.data_parallel_replicate_degree 2 \
  --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2 \
  --validation.local_batch_size 1
train_on_hosts fsdp2_tp2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4 \
  --validation.local_batch_size 2
train_on_hosts pp2_tp2 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 \
  --training.local_batch_size 8 --validation.local_batch_size 4
train_on_hosts fsdp2_cp2 --parallelism.context_parallel_degree 2 --training.local_batch_size 4 \
  --validation.local_batch_size 2
grep -q 'world 4 = pp(1) x dp_replicate(2) x dp_shard(2) x cp(1) x tp(1)' "$WORK/hsdp.log" ||
  fail "hsdp mesh"
grep -q 'world 4 = pp(2) x dp_replicate(1) x dp_shard(1) x cp(1) x tp(2)' "$WORK/pp2_tp2.log" ||
  fail "pp2_tp2 mesh"
for name in fsdp hsdp fsdp2_tp2 pp2_tp2 fsdp2_cp2; do
  same_losses single "$name" loss
  same_losses single "$name" validation_loss
  same_params single "$name"
done
resume_from pp2_tp2 5 pp2_tp2_resumed 1 "${one[@]}"

# Expert parallelism on the tiny MoE model: its 4 experts one per rank, 2 on each host.
moe=(--model.name qwen3 --model.flavor tiny_moe --model.hf_assets_path "" --optimizer.lr 3e-3
  --validation.enable false)
train moe_single 1 "${moe[@]}" --training.local_batch_size 8
train_on_hosts moe_ep4 "${moe[@]}" --training.local_batch_size 2 \
  --parallelism.expert_parallel_degree 4
grep -q 'expert parallel over ep 4: 2 MoE layers, 1 experts\? per rank' "$WORK/moe_ep4.log" ||
  { grep -i 'expert parallel' "$WORK/moe_ep4.log" >&2; fail "moe_ep4: expert-parallel line"; }
same_losses moe_single moe_ep4 loss
same_params moe_single moe_ep4
echo "multihost: every parallelism across two hosts reproduces one process"

# --- a link goes down mid-training ---
fault=(--training.steps 20 --comm.train_timeout_seconds 10 --validation.enable false
  --training.local_batch_size 2)
start_on_hosts linkdown 2 GLOO_SOCKET_IFNAME= -- train "${common[@]}" "${fault[@]}" \
  --job.dump_folder "$WORK/linkdown"
wait_for_step linkdown 8
ip link set "tv${tag}h1" down
wait_nodes
echo "link down after step 8: node 0 exited ${code[0]} after ${elapsed[0]} s," \
  "node 1 exited ${code[1]} after ${elapsed[1]} s (comm.train_timeout_seconds 10)"
for node in 0 1; do
  [ "${code[$node]}" != 0 ] && [ "${code[$node]}" != 124 ] ||
    { tail -n 20 "$WORK/linkdown.node$node" >&2; fail "linkdown: node $node exited ${code[$node]}"; }
  # The timeout (10 s), the diagnosis (at most 4 s), telling the other node (at most 2 s), the
  # exit; with room for a loaded machine.
  [ "${elapsed[$node]}" -le 25 ] || fail "linkdown: node $node took ${elapsed[$node]} s to end"
done
grep -qE "Diagnosis: no heartbeat for [0-9.]+ s from ranks 2, 3 \(node 1, host [^,]+, ${addr[1]}\)" \
  "$WORK/linkdown.node0" ||
  { tail -n 20 "$WORK/linkdown.node0" >&2; fail "linkdown: node 0 does not name the lost host"; }
grep -qE "Diagnosis: the job's store at ${addr[0]}:[0-9]+ .*did not answer" "$WORK/linkdown.node1" ||
  { tail -n 20 "$WORK/linkdown.node1" >&2; fail "linkdown: node 1 does not name the master"; }
grep -o "Diagnosis: [^:]*" "$WORK/linkdown.node0" | head -n 1 | sed 's/^/node 0: /'
grep -oE "Diagnosis: .* did not answer within [0-9.]+ s" "$WORK/linkdown.node1" | head -n 1 | sed 's/^/node 1: /'
ip link set "tv${tag}h1" up
# The last checkpoint (step 5) resumes on the two hosts with the losses the run had before.
[ -d "$WORK/linkdown/checkpoint/step-5" ] || fail "linkdown: no step-5 checkpoint"
mkdir -p "$WORK/relinked/checkpoint"
cp -r "$WORK/linkdown/checkpoint/step-5" "$WORK/relinked/checkpoint/"
train_on_hosts relinked "${fault[@]}" --checkpoint.interval 100
grep -q "resuming training after step 5" "$WORK/relinked.log" || fail "relinked did not resume"
paste -d' ' \
  <(grep '"loss":' "$WORK/linkdown/metrics.jsonl" | tail -n +6 | sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/') \
  <(grep '"loss":' "$WORK/relinked/metrics.jsonl" | sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/') |
  awk 'NF == 2 { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1; n++ }
       END { printf "relinked: %d losses after step 5 as before the fault\n", n; exit bad || n < 2 }' ||
  fail "the run resumed after the fault does not give the losses of before"

# --- a rank killed on one host: the other host's ranks end at once, told through the store ---
start_on_hosts crash 2 GLOO_SOCKET_IFNAME= -- train "${common[@]}" --training.steps 1000 \
  --comm.train_timeout_seconds 60 --validation.enable false --checkpoint.enable false \
  --training.local_batch_size 2 --job.dump_folder "$WORK/crash"
wait_for_step crash 3
victim=""
for pid in $(pgrep -f "dump_folder $WORK/crash" || true); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'RANK=3'; then victim=$pid; fi
done
[ -n "$victim" ] || { cat "$WORK/crash.node0" "$WORK/crash.node1" >&2; fail "crash: no rank 3"; }
kill -KILL "$victim"
wait_nodes
echo "rank 3 killed on host 1: node 0 exited ${code[0]} after ${elapsed[0]} s, node 1 exited" \
  "${code[1]} after ${elapsed[1]} s (comm.train_timeout_seconds 60)"
[ "${code[1]}" = 137 ] || { tail -n 20 "$WORK/crash.node1" >&2; fail "crash: node 1 exited ${code[1]}"; }
[ "${code[0]}" != 0 ] && [ "${code[0]}" != 124 ] ||
  { tail -n 20 "$WORK/crash.node0" >&2; fail "crash: node 0 exited ${code[0]}"; }
[ "${elapsed[0]}" -le 10 ] || fail "crash: node 0 took ${elapsed[0]} s (it waited for a timeout)"
grep -qE "ends: the job was stopped by node 1 \(host [^)]+\): rank 3 \(pid $victim\) was killed by SIGKILL" \
  "$WORK/crash.node0" || { tail -n 20 "$WORK/crash.node0" >&2; fail "crash: node 0 does not say why"; }

# --- a degraded link: 1 ms added each way and 1% of the packets lost ---
# The delay: bed_lib.sh's delay_link (netem on the bridge where the kernel has it; else netdelay on
# each host's input); the loss: nftables drops 1% of the packets arriving at host 1.
delay_link 1
ip netns exec "${ns[1]}" nft -f - <<'NFT'
table inet titan_lossy {
  chain input {
    type filter hook input priority 0; policy accept;
    numgen random mod 100 < 1 counter drop
  }
}
NFT
how="$delay_how: 1 ms each way; nftables drops 1% of the packets arriving at host 1"
# The delay is there: TCP round trips between the hosts take 2 ms more (0.05 ms without).
python="${TITAN_PYTHON:-python3}"
# The echo server takes a free port (a fixed or random one may still be held, e.g. in TIME_WAIT
# from the runs above) and writes it where the client looks for it.
rm -f "$WORK/rtt_port"
rtt=$(
  ip netns exec "${ns[1]}" "$python" -c '
import os, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 0)); s.listen(1)
with open(sys.argv[1] + ".tmp", "w") as f: f.write(str(s.getsockname()[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
c, _ = s.accept()
while True:
    d = c.recv(64)
    if not d: break
    c.sendall(d)' "$WORK/rtt_port" &
  ip netns exec "${ns[0]}" "$python" -c '
import os, socket, sys, time
for attempt in range(100):
    if os.path.exists(sys.argv[2]): break
    time.sleep(0.1)
port = int(open(sys.argv[2]).read())
for attempt in range(100):
    try:
        c = socket.create_connection((sys.argv[1], port))
        break
    except ConnectionRefusedError:
        time.sleep(0.1)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
t = []
for _ in range(20):
    a = time.perf_counter(); c.sendall(b"x"); c.recv(64); t.append(time.perf_counter() - a)
print("%.2f" % (1000 * sorted(t)[10]))' "${addr[1]}" "$WORK/rtt_port"
  wait
)
awk -v r="$rtt" 'BEGIN { exit !(r >= 1.9) }' || fail "degraded: round trip $rtt ms, not 2 ms more"
since=$(date +%s%N)
train_on_hosts degraded --training.local_batch_size 2 --validation.local_batch_size 1
took=$(awk -v ns=$(($(date +%s%N) - since)) 'BEGIN { printf "%.1f", ns / 1e9 }')
same_losses single degraded loss
same_losses single degraded validation_loss
dropped=$(ip netns exec "${ns[1]}" nft list table inet titan_lossy 2>/dev/null |
  sed -nE 's/.*counter packets ([0-9]+).*/\1/p')
was="$delay_how"
undelay_link  # netdelay says how many packets it held as it ends
if [ "${was#netdelay}" != "$was" ]; then
  held=$(cat "$WORK"/netdelay*.err | sed -nE 's/.*: ([0-9]+) packets held.*/\1/p' |
    awk '{ n += $1 } END { print n }')
fi
echo "degraded ($how): the one-process losses; round trip $rtt ms; training took $took s" \
  "(FSDP on the clean link: $fsdp_took s)${dropped:+, $dropped packets dropped}${held:+, $held delayed}"
echo "multihost: all cases passed"
