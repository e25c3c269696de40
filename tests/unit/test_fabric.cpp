// The libfabric endpoint on loopback with the real tcp;ofi_rxm provider.
#include <doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "runtime/fabric/endpoint.hpp"

using namespace tandem;
using namespace tandem::runtime;
using namespace std::chrono_literals;

namespace {

struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::byte>> frames;

  FabricEndpoint::FrameHandler handler() {
    return [this](std::span<const std::byte> f, const PeerRef&) {
      std::lock_guard lock(mu);
      frames.emplace_back(f.begin(), f.end());
      cv.notify_all();
    };
  }
  bool wait_for(size_t count, std::chrono::milliseconds timeout = 5000ms) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return frames.size() >= count; });
  }
};

std::vector<std::byte> bytes_of(std::string_view text) {
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

FabricOptions small_options() {
  FabricOptions o;
  o.frame_bytes_max = 64 * 1024;
  o.recv_buffers = 8;
  o.rma_chunk_bytes = 1 << 20;
  o.rma_inflight_max = 4;
  return o;
}

}  // namespace

TEST_CASE("split_host_port accepts host:port and names what is wrong otherwise") {
  auto ok = split_host_port("127.0.0.1:17100");
  REQUIRE(ok.ok());
  CHECK(ok->first == "127.0.0.1");
  CHECK(ok->second == 17100);
  CHECK_FALSE(split_host_port("127.0.0.1").ok());
  CHECK_FALSE(split_host_port("127.0.0.1:0").ok());
  CHECK_FALSE(split_host_port("127.0.0.1:70000").ok());
  CHECK_FALSE(split_host_port(":80").ok());
  CHECK(split_host_port("h:x").error().message.find("bad port") != std::string::npos);
}

TEST_CASE("two endpoints exchange frames in order over tcp;ofi_rxm") {
  Inbox inbox_a, inbox_b;
  auto a = open_fabric(small_options(), inbox_a.handler());
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().describe()));
  auto b = open_fabric(small_options(), inbox_b.handler());
  REQUIRE(b.ok());
  CHECK((*a)->address().rfind("127.0.0.1:", 0) == 0);
  CHECK((*a)->address() != (*b)->address());

  auto to_b = (*a)->peer((*b)->address());
  REQUIRE(to_b.ok());
  CHECK((*a)->peer((*b)->address()).value() == to_b.value());  // resolved once
  for (int i = 0; i < 200; ++i) {
    REQUIRE((*a)->send(*to_b, bytes_of("frame-" + std::to_string(i))).ok());
  }
  REQUIRE(inbox_b.wait_for(200));
  std::lock_guard lock(inbox_b.mu);
  for (int i = 0; i < 200; ++i) {
    std::string got(reinterpret_cast<const char*>(inbox_b.frames[i].data()),
                    inbox_b.frames[i].size());
    CHECK(got == "frame-" + std::to_string(i));
  }
  CHECK((*b)->counters().frames_received.load() == 200);
}

TEST_CASE("send refuses empty and oversized frames, and unknown peers") {
  Inbox inbox;
  auto a = open_fabric(small_options(), inbox.handler());
  REQUIRE(a.ok());
  auto self = (*a)->peer((*a)->address());
  REQUIRE(self.ok());
  CHECK((*a)->send(*self, std::vector<std::byte>{}).error().kind == ErrorKind::invalid);
  CHECK((*a)->send(*self, std::vector<std::byte>(64 * 1024 + 1)).error().kind ==
        ErrorKind::invalid);
  CHECK((*a)->send(9999, bytes_of("x")).error().kind == ErrorKind::not_found);
}

TEST_CASE("a frame larger than the receiver's buffers is dropped and counted") {
  Inbox inbox_a, inbox_b;
  FabricOptions big = small_options();
  big.frame_bytes_max = 256 * 1024;
  auto a = open_fabric(big, inbox_a.handler());
  auto b = open_fabric(small_options(), inbox_b.handler());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto to_b = (*a)->peer((*b)->address());
  REQUIRE((*a)->send(*to_b, std::vector<std::byte>(200 * 1024, std::byte{7})).ok());
  REQUIRE((*a)->send(*to_b, bytes_of("after")).ok());
  REQUIRE(inbox_b.wait_for(1));
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while ((*b)->counters().frames_dropped.load() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  CHECK((*b)->counters().frames_dropped.load() == 1);
  std::lock_guard lock(inbox_b.mu);
  REQUIRE(inbox_b.frames.size() == 1);
  CHECK(inbox_b.frames[0] == bytes_of("after"));
}

TEST_CASE("backpressure: a peer that never drains refuses sends once its queue is full") {
  Inbox inbox;
  FabricOptions o = small_options();
  o.send_queue_max = 8;
  o.sends_inflight_max = 2;
  auto a = open_fabric(o, inbox.handler());
  REQUIRE(a.ok());
  // Nobody listens on this port: sends stay unacknowledged (or fail), the queue fills.
  auto ghost = (*a)->peer("127.0.0.1:9");
  REQUIRE(ghost.ok());
  int refused = 0;
  for (int i = 0; i < 1000; ++i) {
    Status s = (*a)->send(*ghost, bytes_of("hello"));
    if (!s.ok()) {
      CHECK(s.error().kind == ErrorKind::overloaded);
      ++refused;
    }
  }
  CHECK(refused > 0);
  CHECK((*a)->counters().sends_refused.load() == static_cast<uint64_t>(refused));
}

TEST_CASE("backpressure: control frames use a reserve beyond the full queue and go first") {
  Inbox inbox;
  FabricOptions o = small_options();
  o.send_queue_max = 8;
  o.sends_inflight_max = 1;
  auto a = open_fabric(o, inbox.handler());
  REQUIRE(a.ok());
  auto ghost = (*a)->peer("127.0.0.1:9");  // never drains
  REQUIRE(ghost.ok());
  int data_sent = 0;
  for (int i = 0; i < 100; ++i) data_sent += (*a)->send(*ghost, bytes_of("data")).ok() ? 1 : 0;
  CHECK(data_sent <= 8 + 1);  // the queue, plus what is in flight
  CHECK_FALSE((*a)->send(*ghost, bytes_of("data")).ok());
  // Heartbeats still get in, up to the reserve; then they are refused too (bounded).
  uint32_t control_sent = 0;
  for (uint32_t i = 0; i < FabricEndpoint::control_reserve + 10; ++i) {
    control_sent += (*a)->send(*ghost, bytes_of("heartbeat"), true).ok() ? 1 : 0;
  }
  CHECK(control_sent == FabricEndpoint::control_reserve);
  CHECK_FALSE((*a)->send(*ghost, bytes_of("data")).ok());
}

TEST_CASE("control frames overtake queued data frames to a live peer") {
  Inbox inbox_a, inbox_b;
  FabricOptions o = small_options();
  o.sends_inflight_max = 1;
  auto a = open_fabric(o, inbox_a.handler());
  auto b = open_fabric(small_options(), inbox_b.handler());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto to_b = (*a)->peer((*b)->address());
  REQUIRE(to_b.ok());
  // Many data frames queue up behind the one in flight; a control frame sent last arrives
  // before most of them.
  constexpr int data_frames = 200;
  for (int i = 0; i < data_frames; ++i) REQUIRE((*a)->send(*to_b, bytes_of("d")).ok());
  REQUIRE((*a)->send(*to_b, bytes_of("control"), true).ok());
  REQUIRE(inbox_b.wait_for(data_frames + 1, 10000ms));
  std::lock_guard lock(inbox_b.mu);
  size_t at = 0;
  while (at < inbox_b.frames.size() && inbox_b.frames[at] != bytes_of("control")) ++at;
  REQUIRE(at < inbox_b.frames.size());
  MESSAGE("the control frame arrived at position ", at, " of ", inbox_b.frames.size());
  CHECK(at < data_frames / 2);
}

TEST_CASE("RMA: a 64 MiB region is read by a peer and matches byte for byte") {
  Inbox inbox_a, inbox_b;
  auto a = open_fabric(small_options(), inbox_a.handler());
  auto b = open_fabric(small_options(), inbox_b.handler());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const uint64_t size = 64ull << 20;
  std::vector<std::byte> source(size), target(size);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0; i < size; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(source.data() + i, &x, 8);
  }
  auto src_mr = (*a)->register_memory(source.data(), size);
  auto dst_mr = (*b)->register_memory(target.data(), size);
  REQUIRE(src_mr.ok());
  REQUIRE(dst_mr.ok());
  RemoteRegionRef remote{(*src_mr)->remote_base(), size, (*src_mr)->key()};
  auto to_a = (*b)->peer((*a)->address());
  REQUIRE(to_a.ok());
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Status> result;
  REQUIRE((*b)->read(*to_a, remote, 0, **dst_mr, 0, size, [&](Status s) {
                  std::lock_guard lock(mu);
                  result = s;
                  cv.notify_all();
                }).ok());
  std::unique_lock lock(mu);
  REQUIRE(cv.wait_for(lock, 30s, [&] { return result.has_value(); }));
  CHECK(result->ok());
  CHECK(std::memcmp(source.data(), target.data(), size) == 0);
  CHECK((*b)->counters().rma_bytes.load() == size);

  // Out-of-bounds reads are refused before anything is posted.
  CHECK((*b)->read(*to_a, remote, size - 4, **dst_mr, 0, 8, [](Status) {}).error().kind ==
        ErrorKind::invalid);
  CHECK((*b)->read(*to_a, remote, 0, **dst_mr, size, 8, [](Status) {}).error().kind ==
        ErrorKind::invalid);
}
