// netdelay QUEUE DELAY_MS: holds every packet that netfilter sends to NFQUEUE number QUEUE for
// DELAY_MS milliseconds, then lets it through: a fixed added latency, what `tc qdisc ... netem
// delay` gives, for kernels built without sch_netem (the two-host bed of
// tests/e2e/test_multihost.sh). Packets leave in the order they came. Prints "ready" once bound to
// the queue; ends on SIGTERM / SIGINT, after letting the packets it holds through.
//
//   ip netns exec host1 netdelay 0 5 &
//   ip netns exec host1 iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0 --queue-bypass
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  uint32_t id;
  Clock::time_point due;
};

struct State {
  Clock::duration delay{};
  std::deque<Held> held;
  uint64_t packets = 0;
};

volatile std::sig_atomic_t g_stop = 0;

void on_signal(int) { g_stop = 1; }

int on_packet(nfq_q_handle*, nfgenmsg*, nfq_data* packet, void* data) {
  auto* state = static_cast<State*>(data);
  const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(packet);
  if (header == nullptr) return 0;
  state->held.push_back({ntohl(header->packet_id), Clock::now() + state->delay});
  ++state->packets;
  return 0;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "netdelay: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Accepts every held packet that is due (all of them with `all`): one batch verdict covers the
// ids up to the last one, which the kernel hands out in increasing order.
void release(nfq_q_handle* queue, State& state, bool all) {
  const Clock::time_point now = Clock::now();
  uint32_t last = 0;
  bool any = false;
  while (!state.held.empty() && (all || state.held.front().due <= now)) {
    last = state.held.front().id;
    any = true;
    state.held.pop_front();
  }
  if (any && nfq_set_verdict_batch(queue, last, NF_ACCEPT) < 0) die("verdict");
}

}  // namespace

int main(int argc, char** argv) {
  char* end = nullptr;
  const long queue_num = argc == 3 ? std::strtol(argv[1], &end, 10) : -1;
  const bool queue_ok = end != nullptr && *end == '\0' && queue_num >= 0 && queue_num <= 65535;
  const double delay_ms = argc == 3 ? std::strtod(argv[2], &end) : -1;
  if (!queue_ok || *end != '\0' || !(delay_ms >= 0 && delay_ms <= 60000)) {
    std::fprintf(stderr, "usage: netdelay QUEUE DELAY_MS   (QUEUE 0-65535, DELAY_MS 0-60000)\n");
    return 2;
  }
  State state;
  state.delay = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(delay_ms));

  nfq_handle* handle = nfq_open();
  if (handle == nullptr) die("nfq_open (needs CAP_NET_ADMIN)");
  if (nfq_bind_pf(handle, AF_INET) < 0) die("nfq_bind_pf");
  nfq_q_handle* queue =
      nfq_create_queue(handle, static_cast<uint16_t>(queue_num), &on_packet, &state);
  if (queue == nullptr) die("nfq_create_queue " + std::to_string(queue_num));
  // Only the packet ids come up (no payload); room for a burst of some seconds of packets.
  if (nfq_set_mode(queue, NFQNL_COPY_META, 0) < 0) die("nfq_set_mode");
  if (nfq_set_queue_maxlen(queue, 1 << 17) < 0) die("nfq_set_queue_maxlen");
  nfnl_rcvbufsiz(nfq_nfnlh(handle), 32u << 20);
  const int fd = nfq_fd(handle);

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::printf("ready\n");
  std::fflush(stdout);

  alignas(8) static char buffer[1 << 16];
  uint64_t overruns = 0;
  while (g_stop == 0) {
    // Sleep until the next packet is due (1 ms granularity at most late by the scheduler).
    int timeout_ms = -1;
    if (!state.held.empty()) {
      const auto wait = state.held.front().due - Clock::now();
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, timeout_ms);
    if (ready < 0 && errno != EINTR) die("poll");
    if (ready > 0) {
      while (true) {
        const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
          if (errno == ENOBUFS) {  // the kernel dropped messages (and their packets): TCP resends
            ++overruns;
            continue;
          }
          die("recv");
        }
        nfq_handle_packet(handle, buffer, static_cast<int>(n));
      }
    }
    release(queue, state, /*all=*/false);
  }
  release(queue, state, /*all=*/true);
  std::fprintf(stderr, "netdelay: queue %ld: %llu packets held %.3g ms each (%llu overruns)\n",
               queue_num, static_cast<unsigned long long>(state.packets), delay_ms,
               static_cast<unsigned long long>(overruns));
  nfq_destroy_queue(queue);
  nfq_close(handle);
  return 0;
}
