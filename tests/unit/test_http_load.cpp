// Load: 1,000 concurrent streaming connections on the gateway HTTP server's single thread.
// The client side is one epoll loop over non-blocking sockets; a writer thread feeds every
// stream periodic chunks, then ends them all. Every body must arrive complete and in order,
// every stream must have received data before the writer ended any, nothing is cancelled,
// and the per-stream buffer never exceeds its bound.
#include <doctest.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/gateway/http_server.hpp"
#include "tests/unit/http_test_client.hpp"

using tandem::gateway::HttpHandler;
using tandem::gateway::HttpLimits;
using tandem::gateway::HttpRequest;
using tandem::gateway::HttpServer;
using tandem::gateway::ResponseStream;

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int streams_count = 1000;

class StreamRegistry final : public HttpHandler {
 public:
  void on_request(const HttpRequest& request, std::shared_ptr<ResponseStream> out) override {
    if (request.path != "/stream" || !request.query.starts_with("id=")) {
      out->send(404, {}, "no route");
      return;
    }
    int id = std::stoi(request.query.substr(3));
    out->start(200, {{"Content-Type", "text/event-stream"}});
    std::lock_guard lock(mutex_);
    streams_[id] = std::move(out);
  }
  size_t size() {
    std::lock_guard lock(mutex_);
    return streams_.size();
  }
  std::map<int, std::shared_ptr<ResponseStream>> snapshot() {
    std::lock_guard lock(mutex_);
    return streams_;
  }

 private:
  std::mutex mutex_;
  std::map<int, std::shared_ptr<ResponseStream>> streams_;
};

std::string event_text(int id, int round) {
  return "data: {\"stream\":" + std::to_string(id) + ",\"round\":" + std::to_string(round) +
         "}\n\n";
}

uint64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return resident_pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

void raise_fd_limit(rlim_t wanted) {
  rlimit limit{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &limit) == 0);
  if (limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min(wanted, limit.rlim_max);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &limit) == 0);
  REQUIRE(limit.rlim_cur >= wanted);  // needs ~2 fds per connection (client + server side)
}

struct Conn {
  int fd = -1;
  std::string raw;
  Clock::time_point first_data{};
  bool complete = false;
};

// True once `raw` holds the response head and the terminating chunk.
bool response_complete(const std::string& raw) {
  return raw.find("\r\n\r\n") != std::string::npos && raw.ends_with("\r\n0\r\n\r\n");
}

// Reads everything available on every ready socket until all responses are complete.
// `with_data` counts the streams whose first body bytes have arrived.
void pump_clients(std::vector<Conn>& conns, int epoll_fd, Clock::time_point deadline,
                  std::atomic<int>* with_data = nullptr) {
  int complete = 0;
  std::vector<epoll_event> events(256);
  char buf[65536];
  while (complete < static_cast<int>(conns.size()) && Clock::now() < deadline) {
    int n = epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), 100);
    for (int e = 0; e < n; ++e) {
      Conn& c = conns[events[e].data.u32];
      for (;;) {
        ssize_t got = ::recv(c.fd, buf, sizeof buf, 0);
        if (got <= 0) break;
        c.raw.append(buf, static_cast<size_t>(got));
        if (c.first_data == Clock::time_point{}) {
          size_t head = c.raw.find("\r\n\r\n");
          if (head != std::string::npos && c.raw.size() > head + 4) {
            c.first_data = Clock::now();
            if (with_data) with_data->fetch_add(1);
          }
        }
      }
      if (!c.complete && response_complete(c.raw)) {
        c.complete = true;
        ++complete;
      }
    }
  }
}

// Opens `streams_count` client connections, each asking for /stream?id=N, registered with
// `epoll_fd` (data.u32 = N); waits until the handler holds every stream.
void connect_all(uint16_t port, int epoll_fd, StreamRegistry& registry, std::vector<Conn>& conns,
                 std::vector<std::unique_ptr<http_test::Client>>& clients) {
  for (int i = 0; i < streams_count; ++i) {
    clients.push_back(std::make_unique<http_test::Client>(port));
    conns[i].fd = clients.back()->fd();
    clients.back()->send("GET /stream?id=" + std::to_string(i) +
                         " HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n");
    REQUIRE(fcntl(conns[i].fd, F_SETFL, fcntl(conns[i].fd, F_GETFL) | O_NONBLOCK) == 0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(i);
    REQUIRE(epoll_ctl(epoll_fd, EPOLL_CTL_ADD, conns[i].fd, &ev) == 0);
  }
  auto deadline = Clock::now() + 30s;
  while (registry.size() < streams_count && Clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(registry.size() == streams_count);
}

struct LoadResult {
  int complete = 0, exact = 0, early = 0;
};

LoadResult check_bodies(const std::vector<Conn>& conns, int rounds, Clock::time_point end_started) {
  LoadResult result;
  for (int i = 0; i < streams_count; ++i) {
    const Conn& c = conns[i];
    if (!c.complete) continue;
    ++result.complete;
    if (c.first_data < end_started) ++result.early;
    REQUIRE(c.raw.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    size_t pos = c.raw.find("\r\n\r\n") + 4;
    auto chunks = http_test::decode_chunked(c.raw, pos);
    REQUIRE(chunks.has_value());
    std::string body, expected;
    for (auto& chunk : *chunks) body += chunk;
    for (int round = 0; round < rounds; ++round) expected += event_text(i, round);
    if (body == expected) ++result.exact;
  }
  return result;
}

// `writers_count` threads each feed their share of the streams `rounds` chunks, pausing
// `interval` between rounds, then end them; the client loop reads everything meanwhile.
void run_load(int writers_count, int rounds, std::chrono::milliseconds interval) {
  raise_fd_limit(4 * streams_count + 256);
  StreamRegistry registry;
  HttpLimits limits;
  limits.connections_max = 2 * streams_count;
  limits.connections_per_client_max = 2 * streams_count;  // every client is on 127.0.0.1
  limits.stream_buffer_bytes_max = 64 << 10;
  HttpServer server("127.0.0.1", 0, limits, registry);
  REQUIRE(server.start().ok());
  uint64_t rss_before = rss_bytes();
  int epoll_fd = epoll_create1(0);
  REQUIRE(epoll_fd >= 0);
  std::vector<Conn> conns(streams_count);
  std::vector<std::unique_ptr<http_test::Client>> clients;
  connect_all(server.port(), epoll_fd, registry, conns, clients);
  CHECK(server.stats().connections_open == streams_count);

  auto streams = registry.snapshot();
  std::atomic<uint64_t> buffered_max{0};
  std::atomic<int> failed_writes{0};
  std::vector<Clock::time_point> end_started(writers_count);
  std::atomic<int> with_data{0};
  auto started = Clock::now();
  std::vector<std::thread> writers;
  for (int w = 0; w < writers_count; ++w) {
    writers.emplace_back([&, w]() {
      for (int round = 0; round < rounds; ++round) {
        for (auto& [id, stream] : streams) {
          if (id % writers_count != w) continue;
          if (!stream->write(event_text(id, round))) failed_writes.fetch_add(1);
          uint64_t buffered = stream->buffered_bytes();
          if (buffered > buffered_max.load()) buffered_max.store(buffered);
        }
        if (interval.count() > 0) std::this_thread::sleep_for(interval);
      }
      // Paced streams end only once every client has read body bytes (bounded): a server that
      // held the bytes back until the end would leave them waiting, and `early` below fails.
      // Waiting for the event, not a time window, keeps this true on a loaded machine.
      auto wait_until = Clock::now() + 30s;
      while (interval.count() > 0 && with_data.load() < streams_count && Clock::now() < wait_until) {
        std::this_thread::sleep_for(5ms);
      }
      end_started[w] = Clock::now();
      for (auto& [id, stream] : streams) {
        if (id % writers_count == w && !stream->end()) failed_writes.fetch_add(1);
      }
    });
  }
  pump_clients(conns, epoll_fd, Clock::now() + 90s, &with_data);
  for (auto& t : writers) t.join();
  auto elapsed = Clock::now() - started;
  uint64_t rss_peak = rss_bytes();
  auto result =
      check_bodies(conns, rounds, *std::min_element(end_started.begin(), end_started.end()));
  double rss_delta = static_cast<double>(rss_peak) - static_cast<double>(rss_before);
  std::printf(
      "http load: %d streams x %d chunks, %d writer(s), in %.2f s; RSS %+.1f MiB "
      "(%.1f KiB/stream); max buffered %llu bytes\n",
      streams_count, rounds, writers_count, std::chrono::duration<double>(elapsed).count(),
      rss_delta / (1 << 20), rss_delta / 1024.0 / streams_count,
      static_cast<unsigned long long>(buffered_max.load()));
  CHECK(result.complete == streams_count);
  CHECK(result.exact == streams_count);
  CHECK(failed_writes.load() == 0);
  CHECK(server.stats().streams_cancelled == 0);
  CHECK(buffered_max.load() <= limits.stream_buffer_bytes_max);
  // Bounded memory: well under 256 KiB per open stream (client + server side together).
  CHECK(rss_peak < rss_before + static_cast<uint64_t>(streams_count) * (256u << 10));
  if (interval.count() > 0) {
    CHECK(result.early == streams_count);  // every stream got data before any was ended
  }
  ::close(epoll_fd);
  clients.clear();
  server.stop();
}

}  // namespace

TEST_CASE("1,000 concurrent streaming connections, each fed periodic chunks, all complete") {
  run_load(1, 20, 20ms);
}

TEST_CASE("1,000 streams fed as fast as 4 writer threads can: every byte in order") {
  run_load(4, 200, 0ms);
}
