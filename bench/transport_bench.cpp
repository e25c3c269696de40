#include "bench/transport_bench.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "bench/transport_raw.hpp"
#include "bench/transport_report.hpp"
#include "config/manifest.hpp"
#include "messages/envelope.hpp"
#include "runtime/client/client.hpp"
#include "runtime/fabric/endpoint.hpp"
#include "runtime/node/credentials.hpp"
#include "tests/support/process.hpp"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr uint64_t region_bytes = 64ull << 20;
constexpr uint32_t protocol_version = 1;
constexpr auto reply_timeout = 10s;

struct Settings {
  std::string provider = "tcp;ofi_rxm";
  std::string self_exe;  // this program, for the children
  std::string dir;       // temp dir: ready files, logs, manifest
  std::string sides = "pingpong,raw,tandem,node,auth";
  bool wants(const std::string& side) const {
    return ("," + sides + ",").find("," + side + ",") != std::string::npos;
  }
  uint32_t round_trips_count = 2000;
  uint32_t rate_messages_count = 20000;
  uint32_t window_count = 64;
  uint32_t pingpong_round_trips_count = 500;
  uint32_t node_pings_count = 1000;
  uint64_t read_bytes_per_size = 256ull << 20;
  std::vector<uint64_t> read_sizes_bytes = {4ull << 10, 64ull << 10, 1ull << 20, 16ull << 20,
                                            64ull << 20};
  runtime::FabricOptions fabric;
  // The authenticated channel on both ends (the "auth" side), with this key file.
  std::string key_path;
  uint32_t auth_rounds_count = 3;        // off/on pairs, interleaved
  uint64_t large_frame_bytes = 64 << 10;  // the throughput case's frame
  uint32_t large_messages_count = 4000;
};

// A channel for the bench's two ends: `name` of class `cls`, the key in `key_path`; any peer
// with the key is admitted at the address it names.
std::shared_ptr<runtime::SecureChannel> bench_channel(const std::string& key_path,
                                                      const std::string& name,
                                                      runtime::PeerClass cls) {
  auto key = runtime::load_key_file(key_path, runtime::KeyRole::cluster);
  RT_ASSERT(key.ok(), key.ok() ? "" : key.error().describe());
  runtime::ChannelConfig c;
  c.cluster = "bench-transport";
  c.self_name = name;
  c.self_class = cls;
  c.keys = {std::move(key).value()};
  c.admit = [](const runtime::PeerClaim& claim) -> Result<std::string> { return claim.address; };
  return std::make_shared<runtime::SecureChannel>(std::move(c));
}

double micros_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Repetitions of a read of `size`: enough bytes, at least 8, at most 2000 (latency-bound sizes).
uint64_t read_reps(uint64_t size, uint64_t total_bytes) {
  RT_ASSERT(size > 0);
  return std::clamp<uint64_t>(total_bytes / size, 8, 2000);
}

std::string size_label(uint64_t bytes) {
  if (bytes >= (1ull << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1ull << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// Waits for `path` (written atomically by a child) and returns its text; fails if the child
// exits first or `timeout` passes.
Result<std::string> wait_ready(const std::string& path, testing::Child& child,
                               std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (fs::exists(path)) return testing::read_file(path);
    if (!child.running()) {
      return make_error(ErrorKind::failed, "bench child exited early; its log:\n" + child.log());
    }
    std::this_thread::sleep_for(5ms);
  }
  return make_error(ErrorKind::timed_out,
                    "bench child not ready within " + std::to_string(timeout.count()) + " ms");
}

// "BASE LENGTH KEY" from a ready file.
Result<runtime::RemoteRegionRef> parse_region(const std::string& text) {
  std::istringstream in(text);
  runtime::RemoteRegionRef ref;
  if (!(in >> ref.remote_base >> ref.length_bytes >> ref.key) || ref.length_bytes == 0) {
    return make_error(ErrorKind::invalid, "bad ready line from bench child: '" + text + "'");
  }
  return ref;
}

std::vector<std::byte> ping_frame(const std::string& source_address, uint64_t correlation,
                                  size_t payload_bytes = 0) {
  capnp::MallocMessageBuilder message;
  auto envelope = message.initRoot<wire::Envelope>();
  envelope.setProtocolVersion(protocol_version);
  messages::set_name(envelope.initSource(), {"bench", "client", ""});
  messages::set_name(envelope.initDestination(), {"bench-echo", "node", ""});
  envelope.setSourceAddress(source_address);
  envelope.setCorrelationId(correlation);
  auto ping = envelope.getBody().initPing();
  ping.setNonce(correlation);
  ping.setSentMonoNs(uint64_t(Clock::now().time_since_epoch().count()));
  if (payload_bytes > 0) ping.initPayload(static_cast<unsigned>(payload_bytes));
  auto words = messages::encode_frame(message);
  auto bytes = messages::frame_span(words);
  return {bytes.begin(), bytes.end()};
}

}  // namespace

// ---- the Tandem echo child -------------------------------------------------------------------
namespace {

// Answers every valid Ping with a Pong to the envelope's source address; an AdminRequest
// ends it. Runs on the endpoint's progress thread (as the node's bridge would).
class EchoServer {
 public:
  explicit EchoServer(uint64_t frame_bytes_max) : frame_bytes_max_(frame_bytes_max) {}
  void attach(runtime::FabricEndpoint* fabric) { fabric_.store(fabric); }
  void on_frame(std::span<const std::byte> bytes);
  void wait_quit() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return quit_; });
  }
  uint64_t dropped_count() const { return dropped_.load(); }

 private:
  void answer(wire::Envelope::Reader request);

  uint64_t frame_bytes_max_;
  std::atomic<runtime::FabricEndpoint*> fabric_{nullptr};
  std::atomic<uint64_t> dropped_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
};

void EchoServer::on_frame(std::span<const std::byte> bytes) {
  auto frame = messages::decode_frame(bytes, frame_bytes_max_);
  if (!frame.ok()) {
    dropped_.fetch_add(1);
    return;
  }
  auto envelope = frame->envelope();
  switch (envelope.getBody().which()) {
    case wire::Envelope::Body::PING:
      answer(envelope);
      return;
    case wire::Envelope::Body::ADMIN_REQUEST: {
      std::lock_guard lock(mu_);
      quit_ = true;
      cv_.notify_all();
      return;
    }
    default:
      dropped_.fetch_add(1);
      return;
  }
}

void EchoServer::answer(wire::Envelope::Reader request) {
  runtime::FabricEndpoint* fabric = fabric_.load();
  if (fabric == nullptr) return;  // not attached yet: the parent retries nothing, so count it
  auto peer = fabric->peer(request.getSourceAddress());
  if (!peer.ok()) {
    dropped_.fetch_add(1);
    return;
  }
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::Envelope>();
  reply.setProtocolVersion(request.getProtocolVersion());
  reply.setSource(request.getDestination());
  reply.setDestination(request.getSource());
  reply.setSourceAddress(fabric->address());
  reply.setCorrelationId(request.getCorrelationId());
  auto ping = request.getBody().getPing();
  auto pong = reply.getBody().initPong();
  pong.setNonce(ping.getNonce());
  pong.setSentMonoNs(ping.getSentMonoNs());
  auto words = messages::encode_frame(message);
  auto bytes = messages::frame_span(words);
  if (!fabric->send(*peer, bytes).ok()) {
    dropped_.fetch_add(1);
  }
}

bool write_ready(const std::string& path, const std::string& line) {
  std::string temp = path + ".tmp";
  testing::write_file(temp, line);
  return std::rename(temp.c_str(), path.c_str()) == 0;
}

int serve_tandem(const runtime::FabricOptions& options, const std::string& ready_path) {
  RT_ASSERT(options.port != 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the measuring parent
  EchoServer server(options.frame_bytes_max + (64 << 10));
  auto fabric = runtime::open_fabric(
      options, [&server](std::span<const std::byte> bytes, const runtime::PeerRef&) {
        server.on_frame(bytes);
      });
  if (!fabric.ok()) {
    std::fprintf(stderr, "bench echo: %s\n", fabric.error().describe().c_str());
    return 1;
  }
  server.attach(fabric->get());
  std::vector<std::byte> region(region_bytes, std::byte{0x5a});
  auto mr = (*fabric)->register_memory(region.data(), region.size());
  if (!mr.ok()) {
    std::fprintf(stderr, "bench echo: %s\n", mr.error().describe().c_str());
    return 1;
  }
  std::string line = std::to_string((*mr)->remote_base()) + " " +
                     std::to_string((*mr)->length_bytes()) + " " + std::to_string((*mr)->key()) +
                     "\n";
  if (!write_ready(ready_path, line)) return 1;
  server.wait_quit();
  if (server.dropped_count() > 0) {
    std::fprintf(stderr, "bench echo: %llu frames dropped\n",
                 static_cast<unsigned long long>(server.dropped_count()));
  }
  mr->reset();
  server.attach(nullptr);
  return 0;
}

}  // namespace

// ---- Tandem's transport, measuring side --------------------------------------------------------
namespace {

struct TandemResults {
  std::vector<double> round_trip_us;
  double rate_msg_per_s = 0;
  std::vector<double> read_mb_per_s;
  double large_mb_per_s = 0;  // windowed sends of large_frame_bytes frames (the auth side)
  // CPU time of both processes (this one and the echo child, all threads) per large frame sent
  // and echoed, against the wall time per frame: 2 x wall means both cores were busy.
  double large_cpu_us_per_frame = 0;
  double large_wall_us_per_frame = 0;
};

// Counts Pongs and read completions; the main thread waits on them.
class Waiter {
 public:
  explicit Waiter(uint64_t frame_bytes_max) : frame_bytes_max_(frame_bytes_max) {}
  void on_frame(std::span<const std::byte> bytes) {
    auto frame = messages::decode_frame(bytes, frame_bytes_max_);
    if (!frame.ok() || frame->envelope().getBody().which() != wire::Envelope::Body::PONG) return;
    std::lock_guard lock(mu_);
    ++pongs_;
    cv_.notify_all();
  }
  void on_read(Status status) {
    std::lock_guard lock(mu_);
    ++reads_;
    if (!status.ok()) read_error_ = status.error();
    cv_.notify_all();
  }
  // Waits until more than `seen` pongs arrived; returns the count, or 0 on timeout.
  uint64_t wait_pongs_above(uint64_t seen) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, reply_timeout, [&] { return pongs_ > seen; });
    return pongs_ > seen ? pongs_ : 0;
  }
  Status wait_reads(uint64_t count) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, reply_timeout, [&] { return reads_ >= count; })) {
      return make_error(ErrorKind::timed_out, "RMA read did not complete within 10 s");
    }
    if (read_error_) return *read_error_;
    return {};
  }

 private:
  uint64_t frame_bytes_max_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t pongs_ = 0, reads_ = 0;
  std::optional<Error> read_error_;
};

Error no_reply() {
  return make_error(ErrorKind::timed_out, "echo child did not answer in 10 s");
}

Status round_trips(runtime::FabricEndpoint& fabric, runtime::PeerHandle peer, Waiter& waiter,
                   uint32_t count, TandemResults& out) {
  RT_ASSERT(count > 0);
  uint64_t correlation = 0;
  for (uint32_t i = 0; i < count + count / 10; ++i) {  // the first tenth warms up
    auto t0 = Clock::now();
    if (Status s = fabric.send(peer, ping_frame(fabric.address(), ++correlation)); !s.ok()) {
      return s;
    }
    if (waiter.wait_pongs_above(correlation - 1) == 0) return no_reply();
    if (i >= count / 10) out.round_trip_us.push_back(micros_since(t0));
  }
  return {};
}

// `count` pings of `payload_bytes` with at most window_count unanswered; messages per second.
Result<double> windowed(runtime::FabricEndpoint& fabric, runtime::PeerHandle peer, Waiter& waiter,
                        uint64_t pongs_before, uint64_t count, size_t payload_bytes,
                        const Settings& s) {
  RT_ASSERT(s.window_count > 0 && count > 0);
  uint64_t sent = 0, received = 0, correlation = 1u << 30;
  auto t0 = Clock::now();
  while (received < count) {
    while (sent < count && sent - received < s.window_count) {
      auto frame = ping_frame(fabric.address(), ++correlation, payload_bytes);
      if (Status st = fabric.send(peer, std::move(frame)); !st.ok()) return st.error();
      ++sent;
    }
    uint64_t total = waiter.wait_pongs_above(pongs_before + received);
    if (total == 0) return no_reply();
    received = total - pongs_before;
  }
  return double(received) / (micros_since(t0) / 1e6);
}

Status windowed_rate(runtime::FabricEndpoint& fabric, runtime::PeerHandle peer, Waiter& waiter,
                     uint64_t pongs_before, const Settings& s, TandemResults& out) {
  auto rate = windowed(fabric, peer, waiter, pongs_before, s.rate_messages_count, 0, s);
  if (!rate.ok()) return rate.error();
  out.rate_msg_per_s = *rate;
  return {};
}

Status read_bandwidth(runtime::FabricEndpoint& fabric, runtime::PeerHandle peer, Waiter& waiter,
                      const runtime::RemoteRegionRef& remote, const Settings& s,
                      TandemResults& out) {
  std::vector<std::byte> local(region_bytes);
  auto mr = fabric.register_memory(local.data(), local.size());
  if (!mr.ok()) return mr.error();
  uint64_t reads = 0;
  for (uint64_t size : s.read_sizes_bytes) {
    RT_ASSERT(size <= remote.length_bytes && size <= local.size(), size);
    uint64_t reps = read_reps(size, s.read_bytes_per_size);
    auto t0 = Clock::now();
    for (uint64_t r = 0; r < reps; ++r) {
      Status st = fabric.read(peer, remote, 0, **mr, 0, size,
                              [&waiter](Status done) { waiter.on_read(std::move(done)); });
      if (st.ok()) st = waiter.wait_reads(++reads);
      if (!st.ok()) return st;
    }
    out.read_mb_per_s.push_back(double(reps * size) / micros_since(t0));  // bytes/us = MB/s
  }
  return {};
}

// User + system CPU time of a process, all its threads (from /proc/PID/stat), in µs; 0 when
// it cannot be read.
double process_cpu_us(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; fields >> field; ++i) {  // field 3 is the state; 14 utime, 15 stime
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) {
      stime = std::strtoull(field.c_str(), nullptr, 10);
      break;
    }
  }
  return double(utime + stime) * 1e6 / double(sysconf(_SC_CLK_TCK));
}

// `auth`: the authenticated channel on both ends; then round trips, the small-message rate
// and the large-frame throughput are measured (the RMA reads, never sealed, are not).
// `comparison` (the auth side): no RMA reads, and the large-frame throughput.
Result<TandemResults> measure_tandem(const Settings& s, bool auth = false,
                                     bool comparison = false) {
  uint16_t child_port = testing::free_port();
  std::string ready = s.dir + (auth ? "/tandem-auth.ready" : "/tandem.ready");
  std::filesystem::remove(ready);
  std::vector<std::string> argv = {
      s.self_exe, "bench", "transport", "--serve", "tandem", "--port", std::to_string(child_port),
      "--ready", ready, "--provider", s.provider, "--spin-us", std::to_string(s.fabric.spin_us),
      "--rma-chunk-bytes", std::to_string(s.fabric.rma_chunk_bytes), "--rma-inflight-max",
      std::to_string(s.fabric.rma_inflight_max)};
  if (auth) argv.insert(argv.end(), {"--auth-key", s.key_path});
  testing::Child child(argv, s.dir + (auth ? "/tandem-auth-echo.log" : "/tandem-echo.log"));
  auto line = wait_ready(ready, child, 20000ms);
  if (!line.ok()) return line.error();
  auto remote = parse_region(*line);
  if (!remote.ok()) return remote.error();
  Waiter waiter(s.fabric.frame_bytes_max);
  runtime::FabricOptions options = s.fabric;
  options.port = 0;
  if (auth) options.channel = bench_channel(s.key_path, "bench-client", runtime::PeerClass::client);
  auto fabric = runtime::open_fabric(
      options, [&waiter](std::span<const std::byte> bytes, const runtime::PeerRef&) {
        waiter.on_frame(bytes);
      });
  if (!fabric.ok()) return fabric.error();
  auto peer = (*fabric)->peer("127.0.0.1:" + std::to_string(child_port));
  if (!peer.ok()) return peer.error();
  TandemResults out;
  Status st = round_trips(**fabric, *peer, waiter, s.round_trips_count, out);
  uint64_t pongs = s.round_trips_count + s.round_trips_count / 10;
  if (st.ok()) st = windowed_rate(**fabric, *peer, waiter, pongs, s, out);
  pongs += s.rate_messages_count;
  if (st.ok() && comparison) {
    double cpu0 = process_cpu_us(getpid()) + process_cpu_us(child.pid());
    auto t0 = std::chrono::steady_clock::now();
    auto rate = windowed(**fabric, *peer, waiter, pongs, s.large_messages_count,
                         s.large_frame_bytes, s);
    double wall_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    double cpu_us = process_cpu_us(getpid()) + process_cpu_us(child.pid()) - cpu0;
    if (rate.ok()) {
      out.large_mb_per_s = *rate * double(s.large_frame_bytes) / 1e6;
      out.large_cpu_us_per_frame = cpu_us / double(s.large_messages_count);
      out.large_wall_us_per_frame = wall_us / double(s.large_messages_count);
    }
    st = rate.ok() ? Status{} : Status(rate.error());
  }
  if (st.ok() && !comparison) st = read_bandwidth(**fabric, *peer, waiter, *remote, s, out);
  capnp::MallocMessageBuilder quit;
  auto envelope = quit.initRoot<wire::Envelope>();
  envelope.getBody().initAdminRequest().setCommand("quit");
  auto words = messages::encode_frame(quit);
  auto bytes = messages::frame_span(words);
  (void)(*fabric)->send(*peer, std::vector<std::byte>(bytes.begin(), bytes.end()));
  if (child.wait(5000ms) < 0) std::fprintf(stderr, "bench: echo child did not exit; killed\n");
  if (!st.ok()) return st.error();
  return out;
}

}  // namespace

// ---- fi_pingpong and the raw baseline ---------------------------------------------------------
namespace {

std::string find_pingpong() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin"}) {
    std::string path = std::string(dir) + "/fi_pingpong";
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// One fi_pingpong server + client pair for one size. Iterations shrink with size so that a
// slow machine still finishes (each iteration is one round trip).
Result<PingpongRow> run_pingpong(const Settings& s, const std::string& bin, uint64_t size) {
  uint64_t iterations = size <= 4096 ? s.pingpong_round_trips_count
                                     : std::clamp<uint64_t>((64ull << 20) / size, 3, 200);
  iterations = std::min<uint64_t>(iterations, s.pingpong_round_trips_count);
  Error last = make_error(ErrorKind::failed, "fi_pingpong did not run");
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::string port = std::to_string(testing::free_port());
    std::vector<std::string> common = {bin,
                                       "-e",
                                       "rdm",
                                       "-p",
                                       s.provider,
                                       "-I",
                                       std::to_string(iterations),
                                       "-S",
                                       std::to_string(size)};
    auto server_argv = common;
    server_argv.insert(server_argv.end(), {"-B", port});
    testing::Child server(server_argv, s.dir + "/fi_pingpong-server.log");
    std::this_thread::sleep_for(300ms);  // the server's control socket must listen first
    auto client_argv = common;
    client_argv.insert(client_argv.end(), {"-P", port, "127.0.0.1"});
    auto run = testing::run(client_argv, 120000ms);
    auto row = parse_pingpong_output(run.output);
    if (row.ok() && run.exit_code == 0) return row;
    last = row.ok() ? make_error(
                          ErrorKind::failed,
                          "fi_pingpong exited " + std::to_string(run.exit_code) + ": " + run.output)
                    : row.error();
  }
  return last;
}

Result<RawResults> run_raw(const Settings& s) {
  RawPlan plan;
  plan.provider = s.provider;
  plan.host = "127.0.0.1";
  plan.port = testing::free_port();
  plan.round_trips_count = s.round_trips_count;
  plan.rate_messages_count = s.rate_messages_count;
  plan.window_count = s.window_count;
  plan.read_sizes_bytes = s.read_sizes_bytes;
  plan.read_bytes_per_size = s.read_bytes_per_size;
  std::unique_ptr<testing::Child> child;
  std::string ready = s.dir + "/raw.ready";
  auto start_child = [&]() -> Result<RawRemote> {
    uint16_t child_port = testing::free_port();
    child = std::make_unique<testing::Child>(
        std::vector<std::string>{s.self_exe, "bench", "transport", "--serve", "raw", "--port",
                                 std::to_string(child_port), "--ready", ready, "--provider",
                                 s.provider, "--peer", "127.0.0.1:" + std::to_string(plan.port)},
        s.dir + "/raw-echo.log");
    auto line = wait_ready(ready, *child, 20000ms);
    if (!line.ok()) return line.error();
    auto region = parse_region(*line);
    if (!region.ok()) return region.error();
    return RawRemote{"127.0.0.1:" + std::to_string(child_port), region->remote_base,
                     region->length_bytes, region->key};
  };
  auto results = measure_raw(plan, start_child);
  if (child && child->wait(5000ms) < 0) std::fprintf(stderr, "bench: raw child killed\n");
  return results;
}

}  // namespace

// ---- through a real node ----------------------------------------------------------------------
namespace {

// The node's gateway loads the model's tokenizer: the bundled stories15M (setup installs it
// under the source tree; TANDEM_SOURCE_ROOT, else the current directory).
std::string bench_model_path() {
  const char* root = std::getenv("TANDEM_SOURCE_ROOT");
  return std::filesystem::absolute(std::filesystem::path(root ? root : ".") / "models" /
                                   "stories15M")
      .string();
}

std::string node_manifest(const std::string& provider, uint16_t fabric_port, uint16_t admin_port,
                          uint16_t http_port, uint32_t spin_us) {
  return "[cluster]\nname = \"bench-transport\"\n[fabric]\nprovider = \"" + provider +
         "\"\nspin_us = " + std::to_string(spin_us) +
         "\n[model]\nname = \"bench\"\npath = \"" + bench_model_path() +
         "\"\nblock_tokens = 16\n"
         "max_model_tokens = 256\n"
         "\n[[node]]\nname = \"bench\"\nhost = \"127.0.0.1\"\nfabric_port = " +
         std::to_string(fabric_port) + "\nadmin_port = " + std::to_string(admin_port) +
         "\nhttp_port = " + std::to_string(http_port) +
         "\n[[node.instance]]\nrole = \"gateway\"\nname = \"gateway\"\n"
         "[[node.instance]]\nrole = \"router\"\nname = \"router\"\n"
         "[[node.instance]]\nrole = \"prefill\"\nname = \"prefill\"\nexecutor = \"ep\"\n"
         "[[node.instance]]\nrole = \"decode\"\nname = \"decode\"\nexecutor = \"ed\"\n"
         "[[node.instance]]\nrole = \"executor\"\nname = \"ep\"\ndevice = \"sim\"\n"
         "[[node.instance]]\nrole = \"executor\"\nname = \"ed\"\ndevice = \"sim\"\n"
         "devices = [1]\n";
}

// ClusterClient::ping round trips to NODE/node/ of a freshly started `tandem node`.
Result<std::vector<double>> measure_node(const Settings& s) {
  std::string path = s.dir + "/node.toml";
  testing::write_file(path, node_manifest(s.provider, testing::free_port(), testing::free_port(),
                                          testing::free_port(), s.fabric.spin_us));
  auto loaded = config::load_manifest(path);
  if (!std::holds_alternative<config::Manifest>(loaded)) {
    return make_error(ErrorKind::invalid, "bench: the generated node manifest is invalid");
  }
  const auto manifest = std::get<config::Manifest>(std::move(loaded));
  testing::Child node({s.self_exe, "node", "--manifest", path, "--node", "bench"},
                      s.dir + "/node.log");
  auto client = runtime::ClusterClient::connect(manifest, "127.0.0.1");
  if (!client.ok()) return client.error();
  messages::ActorName to{"bench", "node", ""};
  auto deadline = Clock::now() + 30s;
  while (!(*client)->ping(to, 500ms).ok()) {
    if (!node.running() || Clock::now() > deadline) {
      return make_error(ErrorKind::failed,
                        "tandem node did not answer pings; its log:\n" + node.log());
    }
  }
  std::vector<double> us;
  for (uint32_t i = 0; i < s.node_pings_count + s.node_pings_count / 10; ++i) {
    auto rtt = (*client)->ping(to, 5000ms);
    if (!rtt.ok()) return rtt.error();
    if (i >= s.node_pings_count / 10) us.push_back(double(rtt->count()) / 1e3);
  }
  client->reset();
  node.signal(SIGTERM);
  if (node.wait(5000ms) < 0) std::fprintf(stderr, "bench: tandem node did not stop; killed\n");
  return us;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string machine_line() {
  std::string load = testing::read_file("/proc/loadavg");
  if (!load.empty() && load.back() == '\n') load.pop_back();
  return std::to_string(std::thread::hardware_concurrency()) + " CPUs, " + cpu_model() +
         "; loadavg at start: " + load;
}

}  // namespace

// ---- the report and the command ---------------------------------------------------------------
namespace {

struct Measured {
  std::optional<TandemResults> tandem;
  std::optional<RawResults> raw;
  std::vector<std::optional<PingpongRow>> pingpong;  // [0] = 64 B, then read_sizes_bytes
  std::optional<std::vector<double>> node_us;
  std::vector<TandemResults> auth_off, auth_on;  // interleaved rounds, the same run
};

// The authenticated channel off and on, interleaved rounds; each metric the median of its
// rounds. Returns the lines to print.
std::vector<std::string> auth_report(const Settings& s, const Measured& m) {
  std::vector<std::string> lines;
  if (m.auth_off.empty() || m.auth_on.empty()) return lines;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto metric = [&](const std::vector<TandemResults>& runs, int which) {
    std::vector<double> v;
    for (const auto& r : runs) {
      if (which == 0) v.push_back(percentile(r.round_trip_us, 0.5));
      if (which == 1) v.push_back(percentile(r.round_trip_us, 0.99));
      if (which == 2) v.push_back(r.rate_msg_per_s);
      if (which == 3) v.push_back(r.large_mb_per_s);
      if (which == 4) v.push_back(r.large_cpu_us_per_frame);
      if (which == 5) v.push_back(r.large_wall_us_per_frame);
    }
    return median(v);
  };
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "authenticated fabric, off vs on (the same run, %zu interleaved rounds, medians):",
                m.auth_on.size());
  lines.push_back(buf);
  lines.push_back("  metric                         off         on     on/off");
  const char* names[] = {"round trip 64 B p50 (us)", "round trip 64 B p99 (us)",
                         "message rate 64 B (msg/s)", "64 KiB frames (MB/s)",
                         "  CPU per frame, both (us)", "  wall per frame (us)"};
  double off[6], on[6];
  for (int i = 0; i < 6; ++i) {
    off[i] = metric(m.auth_off, i);
    on[i] = metric(m.auth_on, i);
    std::snprintf(buf, sizeof buf, "  %-26s %10.1f %10.1f %9.3f", names[i], off[i], on[i],
                  on[i] / off[i]);
    lines.push_back(buf);
  }
  std::snprintf(buf, sizeof buf, "goal: 64 KiB frames with authentication >= 0.90x off: %.3fx -> %s",
                on[3] / off[3], on[3] / off[3] >= 0.9 ? "met" : "NOT met");
  lines.push_back(buf);
  std::snprintf(buf, sizeof buf, "goal: added p99 on small frames <= 5 us: %+.1f us -> %s",
                on[1] - off[1], on[1] - off[1] <= 5 ? "met" : "NOT met");
  lines.push_back(buf);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  std::snprintf(buf, sizeof buf,
                "64 KiB frames: the channel adds %.1f us of CPU per frame (sealed by the sender, "
                "opened by the echo, sealed back, opened); CPU / wall = %.2f off, %.2f on, of "
                "%ld cores",
                on[4] - off[4], off[4] / off[5], on[4] / on[5], cores);
  lines.push_back(buf);
  (void)s;
  return lines;
}

std::optional<double> pp_field(const Measured& m, size_t index, bool round_trip) {
  if (index >= m.pingpong.size() || !m.pingpong[index]) return std::nullopt;
  return round_trip ? m.pingpong[index]->round_trip_us() : m.pingpong[index]->mb_per_s;
}

std::vector<ReportRow> build_rows(const Settings& s, const Measured& m) {
  auto pct = [](const std::vector<double>& v, double q) -> std::optional<double> {
    if (v.empty()) return std::nullopt;
    return percentile(v, q);
  };
  const TandemResults* t = m.tandem ? &*m.tandem : nullptr;
  const RawResults* r = m.raw ? &*m.raw : nullptr;
  std::vector<ReportRow> rows;
  rows.push_back({"round trip 64 B p50", "us", t ? pct(t->round_trip_us, 0.5) : std::nullopt,
                  r ? pct(r->round_trip_us, 0.5) : std::nullopt, pp_field(m, 0, true)});
  rows.push_back({"round trip 64 B p99", "us", t ? pct(t->round_trip_us, 0.99) : std::nullopt,
                  r ? pct(r->round_trip_us, 0.99) : std::nullopt, std::nullopt});
  rows.push_back({"message rate, window " + std::to_string(s.window_count), "msg/s",
                  t ? std::optional(t->rate_msg_per_s) : std::nullopt,
                  r ? std::optional(r->rate_msg_per_s) : std::nullopt, std::nullopt});
  for (size_t i = 0; i < s.read_sizes_bytes.size(); ++i) {
    std::optional<double> tv, rv;
    if (t && i < t->read_mb_per_s.size()) tv = t->read_mb_per_s[i];
    if (r && i < r->read_mb_per_s.size()) rv = r->read_mb_per_s[i];
    rows.push_back({"RMA read " + size_label(s.read_sizes_bytes[i]), "MB/s", tv, rv,
                    pp_field(m, i + 1, false)});
  }
  std::optional<double> n50, n99;
  if (m.node_us) n50 = pct(*m.node_us, 0.5), n99 = pct(*m.node_us, 0.99);
  rows.push_back({"node ping p50 (via CAF actor)", "us", n50, rows[0].raw, rows[0].pingpong});
  rows.push_back({"node ping p99 (via CAF actor)", "us", n99, rows[1].raw, std::nullopt});
  return rows;
}

std::vector<std::string> goal_lines(const Settings& s, const std::vector<ReportRow>& rows) {
  std::vector<std::string> lines;
  std::string rma = "goal: RMA read >= 0.90x raw at >= 1 MiB:";
  bool rma_met = true, rma_known = false;
  for (size_t i = 0; i < s.read_sizes_bytes.size(); ++i) {
    const ReportRow& row = rows[3 + i];
    if (s.read_sizes_bytes[i] < (1ull << 20) || !row.tandem || !row.raw) continue;
    double ratio = *row.tandem / *row.raw;
    rma_known = true;
    rma_met = rma_met && ratio >= 0.9;
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %s %.2fx", size_label(s.read_sizes_bytes[i]).c_str(), ratio);
    rma += buf;
  }
  lines.push_back(rma + (rma_known ? (rma_met ? " -> met" : " -> NOT met") : " -> not measured"));
  char buf[256];
  const ReportRow& rt = rows[0];
  if (rt.tandem && rt.pingpong) {
    double ratio = *rt.tandem / *rt.pingpong;
    std::snprintf(buf, sizeof(buf),
                  "goal: round trip <= 2x fi_pingpong: %.1f us vs %.1f us = %.2fx -> %s",
                  *rt.tandem, *rt.pingpong, ratio, ratio <= 2 ? "met" : "NOT met");
    lines.push_back(buf);
  }
  if (rt.tandem && rt.raw) {
    std::snprintf(buf, sizeof(buf), "round trip vs the raw busy-polling baseline: %.2fx",
                  *rt.tandem / *rt.raw);
    lines.push_back(buf);
  }
  return lines;
}

}  // namespace

namespace {

Measured measure_all(const Settings& s, std::vector<std::string>& notes) {
  Measured m;
  auto note_error = [&notes](const std::string& what, const Error& e) {
    notes.push_back(what + " failed: " + e.describe());
    std::fprintf(stderr, "bench transport: %s failed: %s\n", what.c_str(), e.describe().c_str());
  };
  std::string pp = s.wants("pingpong") ? find_pingpong() : "";
  std::vector<uint64_t> pp_sizes = {64};
  pp_sizes.insert(pp_sizes.end(), s.read_sizes_bytes.begin(), s.read_sizes_bytes.end());
  for (uint64_t size : pp_sizes) {
    if (pp.empty()) break;
    std::fprintf(stderr, "fi_pingpong %s ...\n", size_label(size).c_str());
    auto row = run_pingpong(s, pp, size);
    if (!row.ok()) note_error("fi_pingpong " + size_label(size), row.error());
    m.pingpong.push_back(row.ok() ? std::optional(*row) : std::nullopt);
  }
  if (pp.empty() && s.wants("pingpong")) {
    notes.push_back("fi_pingpong not found (install libfabric-bin)");
  }
  if (s.wants("raw")) {
    std::fprintf(stderr, "raw libfabric baseline ...\n");
    auto raw = run_raw(s);
    if (raw.ok())
      m.raw = std::move(*raw);
    else
      note_error("raw baseline", raw.error());
  }
  if (s.wants("tandem")) {
    std::fprintf(stderr, "tandem FabricEndpoint ...\n");
    auto tandem = measure_tandem(s);
    if (tandem.ok())
      m.tandem = std::move(*tandem);
    else
      note_error("tandem transport", tandem.error());
  }
  if (s.wants("auth")) {
    for (uint32_t round = 0; round < s.auth_rounds_count; ++round) {
      std::fprintf(stderr, "authenticated fabric, round %u: off, on ...\n", round + 1);
      auto off = measure_tandem(s, false, true);
      auto on = measure_tandem(s, true, true);
      if (!off.ok()) note_error("auth off", off.error());
      if (!on.ok()) note_error("auth on", on.error());
      if (!off.ok() || !on.ok()) break;
      m.auth_off.push_back(std::move(off).value());
      m.auth_on.push_back(std::move(on).value());
    }
  }
  if (s.wants("node")) {
    std::fprintf(stderr, "tandem node ping ...\n");
    auto node = measure_node(s);
    if (node.ok())
      m.node_us = std::move(*node);
    else
      note_error("node ping", node.error());
  }
  return m;
}

cli::Flags make_flags() {
  cli::Flags flags("tandem bench transport [flags]",
                   "Round trip, message rate and RMA read bandwidth of Tandem's fabric transport "
                   "on 127.0.0.1, beside a raw libfabric baseline and fi_pingpong measured in "
                   "the same run, with ratios.");
  flags.flag("provider", "NAME", "libfabric provider", "tcp;ofi_rxm")
      .flag("json", "FILE", "also write the results as JSON to FILE")
      .flag("quick", "", "few iterations (a smoke run; numbers are not meaningful)")
      .flag("sides", "LIST",
            "what to measure, comma-separated (auth: the authenticated channel off and on, "
            "interleaved, with 64 KiB frames)",
            "pingpong,raw,tandem,node,auth")
      .flag("round-trips", "N", "64 B round trips per side", "2000")
      .flag("spin-us", "US", "FabricEndpoint busy-poll after activity (FabricOptions::spin_us)",
            std::to_string(runtime::FabricOptions{}.spin_us))
      .flag("rma-chunk-bytes", "N", "FabricOptions::rma_chunk_bytes",
            std::to_string(runtime::FabricOptions{}.rma_chunk_bytes))
      .flag("rma-inflight-max", "N", "FabricOptions::rma_inflight_max",
            std::to_string(runtime::FabricOptions{}.rma_inflight_max))
      .flag("sends-inflight-max", "N", "FabricOptions::sends_inflight_max",
            std::to_string(runtime::FabricOptions{}.sends_inflight_max))
      .flag("serve", "KIND", "(internal) run as the bench's 'raw' or 'tandem' echo child")
      .flag("port", "PORT", "(internal) the echo child's fabric port")
      .flag("peer", "HOST:PORT", "(internal) the raw echo child's parent")
      .flag("ready", "PATH", "(internal) where the echo child writes its region")
      .flag("auth-key", "PATH", "(internal) the tandem echo child seals with this key");
  return flags;
}

// Reads a positive integer flag that must fit in 32 bits; prints the problem otherwise.
std::optional<uint32_t> get_u32(const cli::Flags& flags, const std::string& name) {
  auto v = flags.get_int(name);
  if (!v) return std::nullopt;
  if (*v <= 0 || *v > int64_t(UINT32_MAX)) {
    std::fprintf(stderr, "tandem bench transport: --%s must be a positive integer\n", name.c_str());
    return std::nullopt;
  }
  return uint32_t(*v);
}

std::optional<Settings> read_settings(const cli::Flags& flags) {
  Settings s;
  s.provider = flags.get("provider");
  s.sides = flags.get("sides");
  s.fabric.provider = s.provider;
  s.fabric.host = "127.0.0.1";
  auto spin = flags.get_int("spin-us");
  auto chunk = get_u32(flags, "rma-chunk-bytes");
  auto inflight = get_u32(flags, "rma-inflight-max");
  auto sends = get_u32(flags, "sends-inflight-max");
  auto trips = get_u32(flags, "round-trips");
  if (!spin || *spin < 0 || !chunk || !inflight || !sends || !trips) return std::nullopt;
  s.fabric.spin_us = uint32_t(*spin);
  s.fabric.rma_chunk_bytes = *chunk;
  s.fabric.rma_inflight_max = *inflight;
  s.fabric.sends_inflight_max = *sends;
  s.round_trips_count = *trips;
  if (flags.has("quick")) {
    s.round_trips_count = std::min<uint32_t>(s.round_trips_count, 100);
    s.rate_messages_count = 1000;
    s.pingpong_round_trips_count = 20;
    s.node_pings_count = 50;
    s.read_bytes_per_size = 8ull << 20;
    s.read_sizes_bytes = {4ull << 10, 1ull << 20};
    s.auth_rounds_count = 1;
    s.large_messages_count = 200;
  }
  std::error_code ec;
  s.self_exe = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) return std::nullopt;
  return s;
}

int serve(const cli::Flags& flags, const Settings& s) {
  auto port = get_u32(flags, "port");
  if (!port || *port > 65535 || flags.get("ready").empty()) {
    std::fprintf(stderr, "tandem bench transport --serve needs --port and --ready\n");
    return 2;
  }
  if (flags.get("serve") == "raw") {
    if (flags.get("peer").empty()) {
      std::fprintf(stderr, "tandem bench transport --serve raw needs --peer\n");
      return 2;
    }
    return serve_raw(s.provider, "127.0.0.1", uint16_t(*port), flags.get("peer"),
                     flags.get("ready"), region_bytes);
  }
  if (flags.get("serve") == "tandem") {
    runtime::FabricOptions options = s.fabric;
    options.port = uint16_t(*port);
    options.frame_bytes_max = s.fabric.frame_bytes_max;
    if (flags.has("auth-key")) {
      options.channel = bench_channel(flags.get("auth-key"), "bench-echo", runtime::PeerClass::node);
    }
    return serve_tandem(options, flags.get("ready"));
  }
  std::fprintf(stderr, "tandem bench transport: --serve must be 'raw' or 'tandem'\n");
  return 2;
}

void print_settings(const Settings& s) {
  std::printf(
      "provider %s, 127.0.0.1; FabricOptions: spin_us %u, rma_chunk_bytes %u, "
      "rma_inflight_max %u, sends_inflight_max %u\n",
      s.provider.c_str(), s.fabric.spin_us, s.fabric.rma_chunk_bytes, s.fabric.rma_inflight_max,
      s.fabric.sends_inflight_max);
  std::printf(
      "%u round trips per side (after %u warm-up), rate: %u messages, reads: "
      "max(8, min(2000, %llu MiB / size)) per size, one read outstanding\n",
      s.round_trips_count, s.round_trips_count / 10, s.rate_messages_count,
      static_cast<unsigned long long>(s.read_bytes_per_size >> 20));
}

}  // namespace

int run_transport_bench(cli::Args args) {
  cli::Flags flags = make_flags();
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  auto settings = read_settings(flags);
  if (!settings) return 2;
  if (flags.has("serve")) return serve(flags, *settings);
  settings->dir = testing::make_temp_dir("bench-transport");
  settings->key_path = settings->dir + "/bench.key";
  if (Status k = runtime::write_key_file(settings->key_path); !k.ok()) {
    std::fprintf(stderr, "tandem bench transport: %s\n", k.error().describe().c_str());
    return 1;
  }
  std::string machine = machine_line();
  std::vector<std::string> notes;
  Measured m = measure_all(*settings, notes);
  auto rows = build_rows(*settings, m);
  std::printf("machine: %s\n", machine.c_str());
  print_settings(*settings);
  std::printf("\n%s\n", render_table(rows).c_str());
  for (const auto& line : goal_lines(*settings, rows)) {
    std::printf("%s\n", line.c_str());
    notes.push_back(line);
  }
  for (const auto& line : auth_report(*settings, m)) {
    std::printf("%s\n", line.c_str());
    notes.push_back(line);
  }
  std::printf(
      "fi_pingpong: round trip = 2 x its usec/xfer (a mean, half a round trip each); "
      "its MB/sec is a send/recv ping-pong counting both directions, not RMA.\n");
  for (const auto& n : notes) {
    if (n.rfind("goal", 0) != 0 && n.rfind("round trip vs", 0) != 0) {
      std::printf("note: %s\n", n.c_str());
    }
  }
  if (flags.has("json")) {
    std::ofstream out(flags.get("json"));
    out << render_json(rows, machine, notes);
    if (!out) {
      std::fprintf(stderr, "tandem bench transport: cannot write %s\n", flags.get("json").c_str());
      return 1;
    }
  }
  const Settings& s = *settings;
  bool complete = (m.tandem || !s.wants("tandem")) && (m.raw || !s.wants("raw")) &&
                  (m.node_us || !s.wants("node")) &&
                  (m.auth_on.size() == s.auth_rounds_count || !s.wants("auth"));
  if (complete)
    fs::remove_all(settings->dir);
  else
    std::fprintf(stderr, "logs kept in %s\n", settings->dir.c_str());
  return complete ? 0 : 1;
}

}  // namespace tandem::bench
