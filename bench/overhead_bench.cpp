#include "bench/overhead_bench.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "actors/gateway/http_server.hpp"
#include "bench/serve_bench.hpp"
#include "devices/device.hpp"
#include "runtime/base/assert.hpp"

namespace tandem::bench {
namespace {

constexpr uint32_t kPromptTokens = 16;

// The sim parameters of both the cluster's executors and the direct baseline.
const std::vector<std::pair<const char*, double>> kSim = {
    {"time_factor", 0},     {"kv_scale", 0.0078125},      {"vocab", 32000},
    {"bos_id", 1},          {"eos_id", 2},                {"max_position", 4096},
    {"output_tokens_sigma", 0}, {"output_tokens_mean", 16384}, {"output_tokens_max", 16384}};

uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  RT_ASSERT(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, "bind port 0");
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// gateway_extra: more [gateway] lines ("key = value\n"...).
std::string manifest_text(const std::string& model_dir, uint16_t http_port,
                          const std::string& gateway_extra = "") {
  std::string t = "[cluster]\nname = \"overhead\"\n[model]\nname = \"stories15M\"\npath = \"" +
                  model_dir + "\"\nblock_tokens = 16\nmax_model_tokens = 4096\n"
                  "[gateway]\nrequests_max = 4096\nconnections_per_client_max = 4096\n" +
                  gateway_extra +
                  "[decode]\nwaiting_max = 4096\nseqs_max = 1024\nstep_tokens_max = 4096\n"
                  "[prefill]\nqueue_max = 4096\nrunning_max = 256\nheld_max = 1024\n[sim]\n";
  for (const auto& [k, v] : kSim) {
    char value[64];
    std::snprintf(value, sizeof(value), "%.17g", v);  // exact: 1/128 must stay 1/128
    t += std::string(k) + " = " + value + "\n";
  }
  t += "[[node]]\nname = \"local\"\nhost = \"127.0.0.1\"\nfabric_port = " +
       std::to_string(free_port()) + "\nadmin_port = " + std::to_string(free_port()) +
       "\nhttp_port = " + std::to_string(http_port) + "\n";
  auto inst = [](const std::string& body) { return "[[node.instance]]\n" + body; };
  t += inst("role = \"gateway\"\nname = \"gateway\"\n") +
       inst("role = \"router\"\nname = \"router\"\n") +
       inst("role = \"prefill\"\nname = \"prefill\"\nexecutor = \"exec-p\"\n") +
       inst("role = \"decode\"\nname = \"decode\"\nexecutor = \"exec-d\"\n") +
       inst("role = \"executor\"\nname = \"exec-p\"\ndevice = \"sim\"\ndevices = [0]\n"
            "kv_blocks = 4096\n") +
       inst("role = \"executor\"\nname = \"exec-d\"\ndevice = \"sim\"\ndevices = [1]\n"
            "kv_blocks = 4096\n");
  return t;
}

// The node process; SIGTERM then wait on destruction.
class NodeProcess {
 public:
  NodeProcess(const std::string& manifest, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl("/proc/self/exe", "tandem", "node", "--manifest", manifest.c_str(), "--node", "local",
            static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~NodeProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 500 && waitpid(pid_, nullptr, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  NodeProcess(const NodeProcess&) = delete;
  NodeProcess& operator=(const NodeProcess&) = delete;
  bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

bool wait_healthy(const HttpEndpoint& gateway, const NodeProcess& node, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline && node.alive()) {
    auto got = http_get(gateway, "/health", 1000);
    if (got.ok() && got->first == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Direct baseline: per request one prefill of kPromptTokens + (output - 1) decode steps.
Result<workload::LatencyStats> direct_e2e(uint32_t output_tokens, uint32_t requests_count) {
  devices::DeviceSpec spec;
  spec.kind = config::DeviceKind::sim;
  spec.block_tokens = 16;
  spec.blocks_total = 64;
  for (const auto& [k, v] : kSim) spec.sim[k] = v;
  auto device = devices::make_device(spec);
  if (!device.ok()) return device.error();
  std::vector<double> e2e_ms;
  for (uint32_t r = 0; r < requests_count; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    devices::PrefillSeq p{r, {0, 1, 2}, 0, std::vector<int32_t>(kPromptTokens)};
    for (uint32_t i = 0; i < kPromptTokens; ++i) {
      p.tokens[i] = static_cast<int32_t>(3 + r % 997 + i);
    }
    auto out = (*device)->prefill(std::span(&p, 1));
    if (!out.ok()) return out.error();
    int32_t last = out->seqs[0].tokens[0];
    for (uint32_t s = 1; s < output_tokens; ++s) {
      devices::DecodeSeq d{r, {0, 1, 2}, kPromptTokens + s - 1, {last}};
      auto step = (*device)->decode(std::span(&d, 1));
      if (!step.ok()) return step.error();
      last = step->seqs[0].tokens[0];
    }
    e2e_ms.push_back(std::chrono::duration<double, std::milli>(
                         std::chrono::steady_clock::now() - t0).count());
  }
  return workload::latency_stats(std::move(e2e_ms));
}

// CPU time (ns) the process has used so far: the sum of its threads' on-CPU time
// (/proc/PID/task/*/schedstat, first field; nanoseconds, unlike stat's clock ticks).
// Threads that exited are not counted (the node keeps its threads for its life).
uint64_t process_cpu_ns(pid_t pid) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "schedstat");
    uint64_t ns = 0;
    if (in >> ns) total += ns;
  }
  return total;
}

// CPU time (ns) of the calling thread: the bench client runs on it.
uint64_t thread_cpu_ns() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  auto ns = [](const timeval& t) { return uint64_t(t.tv_sec) * 1000000000u + t.tv_usec * 1000u; };
  return ns(u.ru_utime) + ns(u.ru_stime);
}

// The transport floor: the same client against Tandem's HTTP transport (gateway::HttpServer,
// kj-http) answering every completion at once from its own thread with canned SSE events of
// the gateway's shape -- one per output token, the finish, the usage, [DONE] -- and no
// actors, router, device or rendering behind it. What a request costs the client, the
// loopback TCP stack and the HTTP layer alone on this machine, in the same run.
class FloorHandler : public gateway::HttpHandler {
 public:
  void on_request(const gateway::HttpRequest& request,
                  std::shared_ptr<gateway::ResponseStream> out) override {
    if (request.method != "POST" || request.path != "/v1/completions") {
      out->send(404, {{"Content-Type", "application/json"}},
                R"({"error":{"message":"the floor serves POST /v1/completions only",)"
                R"("type":"not_found_error","param":null,"code":null}})");
      return;
    }
    uint32_t tokens = 1;
    if (auto at = request.body.find("\"max_tokens\":"); at != std::string::npos) {
      tokens = static_cast<uint32_t>(std::strtoul(request.body.c_str() + at + 13, nullptr, 10));
    }
    tokens = std::clamp(tokens, 1u, 65536u);  // the bench asks for 1 or 16
    out->start(200, {{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}});
    for (uint32_t i = 0; i < tokens; ++i) out->write(kText);
    out->write(kFinish + kUsageHead + std::to_string(tokens) + kUsageTail + kDone);
    out->end();
  }

 private:
  static constexpr const char* kHead =
      R"(data: {"id":"cmpl-0123456789abcdefghijklmn","object":"text_completion",)"
      R"("created":1796047335,"model":"stories15M","choices":[{"index":0,)";
  const std::string kText =
      std::string(kHead) + R"("text":" dol","logprobs":null,"finish_reason":null}]})" + "\n\n";
  const std::string kFinish =
      std::string(kHead) + R"("text":"","logprobs":null,"finish_reason":"length"}]})" + "\n\n";
  const std::string kUsageHead =
      R"(data: {"choices":[],"created":1796047335,"id":"cmpl-0123456789abcdefghijklmn",)"
      R"("model":"stories15M","object":"text_completion","usage":{"completion_tokens":)";
  const std::string kUsageTail =
      R"(,"completion_tokens_details":{"reasoning_tokens":0},"prompt_tokens":16,)"
      R"("prompt_tokens_details":{"cached_tokens":0},"total_tokens":0}})" + std::string("\n\n");
  const std::string kDone = "data: [DONE]\n\n";
};

struct Point {
  uint32_t concurrency = 0, output_tokens = 0;
  workload::BenchSummary cluster;
  workload::LatencyStats direct;
  workload::BenchSummary floor;  // empty when the floor was not measured
  double node_cpu_us = 0, client_cpu_us = 0;  // per request (the cluster's run)
};

// The same workload against `target` (closed loop, or Poisson arrivals at rate_per_s > 0
// with at most `concurrency` in flight). client_cpu_us: the client's CPU per request.
Result<workload::BenchSummary> drive(const HttpEndpoint& target, uint32_t concurrency,
                                     uint32_t output_tokens, uint32_t requests_count,
                                     double rate_per_s, double* client_cpu_us) {
  workload::RandomParams p;
  p.seed = concurrency * 100 + output_tokens;
  p.vocab_size = 32000;
  p.requests_count = requests_count;
  p.input_tokens = kPromptTokens;
  p.output_tokens = output_tokens;
  auto requests = workload::generate_random(p);
  if (!requests.ok()) return requests.error();
  ServeBenchOptions o;
  o.target = target;
  o.model = "stories15M";
  o.concurrency = concurrency;
  o.request_rate_per_s = rate_per_s;
  o.chain_sessions = false;
  o.progress = false;
  o.timeout_s = 60;
  uint64_t cpu0 = thread_cpu_ns();
  auto run = run_serve_bench(*requests, o);
  if (!run.ok()) return run.error();
  *client_cpu_us = double(thread_cpu_ns() - cpu0) / 1000.0 / requests_count;
  return run->summary;
}

// One point: the cluster (and the node's CPU per request), the floor when given, and the
// direct device baseline. rate_per_s > 0: open loop (see drive).
Result<Point> measure(const HttpEndpoint& gateway, pid_t node_pid,
                      const std::optional<HttpEndpoint>& floor, uint32_t concurrency,
                      uint32_t output_tokens, uint32_t requests_count, double rate_per_s = 0) {
  Point pt{concurrency, output_tokens, {}, {}, {}, 0, 0};
  uint64_t node0 = process_cpu_ns(node_pid);
  auto cluster = drive(gateway, concurrency, output_tokens, requests_count, rate_per_s,
                       &pt.client_cpu_us);
  if (!cluster.ok()) return cluster.error();
  pt.node_cpu_us = double(process_cpu_ns(node_pid) - node0) / 1000.0 / requests_count;
  pt.cluster = std::move(cluster).value();
  if (floor) {
    double floor_client_cpu_us = 0;  // about the cluster's: the same client work
    auto f = drive(*floor, concurrency, output_tokens, requests_count, rate_per_s,
                   &floor_client_cpu_us);
    if (!f.ok()) return make_error(ErrorKind::failed, "floor: " + f.error().describe());
    pt.floor = std::move(f).value();
  }
  auto direct = direct_e2e(output_tokens, std::min<uint32_t>(requests_count, 2000));
  if (!direct.ok()) return direct.error();
  pt.direct = *direct;
  return pt;
}

constexpr const char* kTableHead =
    "| streams | out | requests | cluster p50 ms | cluster p99 ms | direct p50 ms | "
    "direct p99 ms | added p50 ms | added p99 ms | req/s | floor p50 ms | floor p99 ms | "
    "floor req/s | over floor p50 ms | over floor p99 ms | node CPU us/req | "
    "client CPU us/req |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
    "| --- | --- |\n";

void print_point(const Point& pt) {
  const auto& c = pt.cluster;
  const auto& f = pt.floor;
  std::string errors;
  for (const auto& [kind, n] : c.errors_by_kind) errors += " " + kind + "=" + std::to_string(n);
  for (const auto& [kind, n] : f.errors_by_kind) {
    errors += " floor:" + kind + "=" + std::to_string(n);
  }
  std::printf("| %5u | %3u | %6llu | %8.3f | %8.3f | %8.4f | %8.4f | %8.3f | %8.3f | %9.0f "
              "| %8.3f | %8.3f | %9.0f | %8.3f | %8.3f | %6.1f | %6.1f |%s\n",
              pt.concurrency, pt.output_tokens, static_cast<unsigned long long>(c.requests_count),
              c.e2e_ms.p50, c.e2e_ms.p99, pt.direct.p50, pt.direct.p99,
              c.e2e_ms.p50 - pt.direct.p50, c.e2e_ms.p99 - pt.direct.p99,
              c.request_throughput_per_s, f.e2e_ms.p50, f.e2e_ms.p99, f.request_throughput_per_s,
              c.e2e_ms.p50 - pt.direct.p50 - f.e2e_ms.p50,
              c.e2e_ms.p99 - pt.direct.p99 - f.e2e_ms.p99, pt.node_cpu_us, pt.client_cpu_us,
              errors.empty() ? "" : (" errors:" + errors).c_str());
  std::fflush(stdout);
}

void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// The largest wait of stream `o` for its next text chunk (from the request's send, then
// between chunks) among the waits that overlap [from_ms, to_ms] (ms on the client's clock).
double max_gap_ms(const StreamOutcome& o, double from_ms, double to_ms) {
  double gap = 0, previous = o.send_ms;
  for (double at : o.chunk_ms) {
    if (at >= from_ms && previous <= to_ms) gap = std::max(gap, at - previous);
    previous = at;
  }
  return gap;
}

struct IsolationRound {
  double quiet_gap_ms = 0, loaded_gap_ms = 0, big_ms = 0;
  uint32_t big_ok = 0;
};

// One stream of `stream_tokens` tokens; when `big` > 0, that many count_tokens requests
// with `big_body` start once the stream's first text arrives. Returns the stream's largest
// chunk gap while the big requests were in flight (or over the whole stream when none).
Result<IsolationRound> isolation_round(const HttpEndpoint& gateway, uint32_t stream_tokens,
                                       uint32_t big, const std::string& big_body) {
  StreamClient client(gateway, 60000);
  std::string prompt;
  for (uint32_t i = 0; i < kPromptTokens; ++i) prompt += (i ? "," : "") + std::to_string(300 + i);
  StreamCall stream;
  stream.body = "{\"model\":\"stories15M\",\"prompt\":[" + prompt + "],\"max_tokens\":" +
                std::to_string(stream_tokens) + ",\"temperature\":0,\"stream\":true}";
  client.start(0, stream);
  std::optional<StreamOutcome> streamed;
  std::vector<StreamOutcome> bigs;
  double big_start = -1;
  IsolationRound round;
  while (!streamed || bigs.size() < big) {
    for (auto& [tag, outcome] : client.poll(5)) {
      if (tag == 0) {
        streamed = std::move(outcome);
      } else {
        bigs.push_back(std::move(outcome));
      }
    }
    if (big > 0 && big_start < 0 && client.in_flight_count() > 0) {
      // Start the big requests right away: the stream is in flight (its first chunk comes
      // within a millisecond at time factor 0).
      big_start = client.now_ms();
      for (uint32_t b = 1; b <= big; ++b) {
        StreamCall call;
        call.path = "/v1/messages/count_tokens";
        call.body = big_body;
        client.start(b, call);
      }
    }
  }
  if (!streamed->error_kind.empty()) {
    return make_error(ErrorKind::failed, "stream: " + streamed->error_kind + " " +
                                             streamed->error_detail);
  }
  if (big == 0) {
    round.quiet_gap_ms = max_gap_ms(*streamed, 0, 1e300);
    return round;
  }
  double big_end = big_start;
  for (const auto& b : bigs) {
    big_end = std::max(big_end, b.end_ms);
    round.big_ok += b.error_kind.empty() || b.error_kind == "bad_response" ? 1 : 0;
  }
  round.big_ms = big_end - big_start;
  round.loaded_gap_ms = max_gap_ms(*streamed, big_start, big_end);
  return round;
}

struct StartedCluster {
  std::string dir;
  HttpEndpoint gateway;
  std::unique_ptr<NodeProcess> node;
};

// Writes the manifest to a temp dir, starts the node and waits for /health.
Result<StartedCluster> start_cluster(const std::string& model_dir, const char* what,
                                     const std::string& gateway_extra = "") {
  if (!std::filesystem::is_directory(model_dir)) {
    return make_error(ErrorKind::invalid,
                      std::string(what) + ": --model-dir " + model_dir + " is not a directory");
  }
  raise_fd_limit();
  char dir_template[] = "/tmp/tandem-overhead-XXXXXX";
  StartedCluster c;
  c.dir = mkdtemp(dir_template);
  c.gateway = {"127.0.0.1", free_port()};
  std::ofstream(c.dir + "/cluster.toml") << manifest_text(model_dir, c.gateway.port,
                                                          gateway_extra);
  c.node = std::make_unique<NodeProcess>(c.dir + "/cluster.toml", c.dir + "/node.log");
  if (!wait_healthy(c.gateway, *c.node, 60)) {
    return make_error(ErrorKind::failed, std::string(what) +
                                             ": the node did not become healthy; log: " +
                                             c.dir + "/node.log");
  }
  return c;
}

// The body of a count_tokens request of about `tokens` tokens (~4 characters per token of
// this text with the stories15M tokenizer): all preparation, no generation.
std::string long_prompt_body(int64_t tokens) {
  std::string words;
  static const char* kWords[] = {"the ", "little ", "dog ", "ran ", "to ", "a ", "big ", "park "};
  for (size_t i = 0; words.size() < size_t(tokens) * 4; ++i) words += kWords[i % 8];
  return "{\"model\":\"stories15M\",\"max_tokens\":1,\"messages\":[{\"role\":"
         "\"user\",\"content\":\"" + words + "\"}]}";
}

struct AdmissionRound {
  std::vector<double> short_ms;  // short requests, one after another, while the bigs ran
  double big_ms = 0;             // from the bigs' start to the last one's end (0: none)
};

// Short one-token completions, one after another: `quiet_count` of them when `big` is 0;
// else `big` count_tokens requests start at once and short requests follow one after
// another (the first right away) until the last big one ends.
Result<AdmissionRound> admission_round(const HttpEndpoint& gateway, uint32_t big,
                                       const std::string& big_body, uint32_t quiet_count) {
  StreamClient client(gateway, 60000);
  std::string prompt;
  for (uint32_t i = 0; i < kPromptTokens; ++i) prompt += (i ? "," : "") + std::to_string(300 + i);
  StreamCall small;
  small.body = "{\"model\":\"stories15M\",\"prompt\":[" + prompt +
               "],\"max_tokens\":1,\"temperature\":0,\"stream\":true}";
  AdmissionRound round;
  double big_start = client.now_ms(), big_end = big_start;
  for (uint32_t b = 1; b <= big; ++b) {
    StreamCall call;
    call.path = "/v1/messages/count_tokens";
    call.body = big_body;
    client.start(b, call);
  }
  uint32_t bigs_done = 0;
  uint64_t next_tag = 1000;
  client.start(next_tag++, small);
  bool small_in_flight = true;
  while (small_in_flight || bigs_done < big) {
    for (auto& [tag, outcome] : client.poll(5)) {
      if (tag < 1000) {
        ++bigs_done;
        big_end = std::max(big_end, outcome.end_ms);
        continue;
      }
      if (!outcome.error_kind.empty()) {
        return make_error(ErrorKind::failed, "short request: " + outcome.error_kind + " " +
                                                 outcome.error_detail);
      }
      round.short_ms.push_back(outcome.end_ms - outcome.send_ms);
      small_in_flight = false;
      bool more = big > 0 ? bigs_done < big : round.short_ms.size() < quiet_count;
      if (more) {
        client.start(next_tag++, small);
        small_in_flight = true;
      }
    }
  }
  if (big > 0) round.big_ms = big_end - big_start;
  return round;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int run_admission_bench(cli::Args args) {
  cli::Flags f("tandem bench admission [--model-dir DIR] [--prompt-tokens N] [--big N] "
               "[--rounds N]",
               "How long a short request waits while long prompts are being prepared (parsed,\n"
               "tokenized, hashed) at the gateway: one-token completions sent one after another\n"
               "while --big count_tokens requests of --prompt-tokens tokens are prepared, beside\n"
               "the same short requests alone. Two gateways, same run (a cluster each; sim\n"
               "device, time factor 0): one preparer for every request (the baseline), and the\n"
               "default preparers (short requests on the workers, long prompts on threads).");
  f.flag("model-dir", "DIR", "tokenizer source (stories15M)", "models/stories15M")
      .flag("prompt-tokens", "N", "tokens per big request", "50000")
      .flag("big", "N", "big requests per loaded round", "2")
      .flag("rounds", "N", "rounds (each: short requests alone, then during the big ones)", "7");
  int code = 0;
  if (!f.parse(args, &code)) return code;
  auto prompt_tokens = f.get_int("prompt-tokens");
  auto big = f.get_int("big");
  auto rounds = f.get_int("rounds");
  if (!prompt_tokens || *prompt_tokens < 1 || *prompt_tokens > 1000000 || !big || *big < 1 ||
      *big > 64 || !rounds || *rounds < 1 || *rounds > 1000) {
    std::fprintf(stderr, "tandem bench admission: --prompt-tokens 1..1000000, --big 1..64, "
                         "--rounds 1..1000\n");
    return 2;
  }
  struct Variant {
    const char* name;
    const char* gateway_extra;
  };
  const Variant variants[] = {
      {"one preparer", "preparers = 1\nlong_prompt_bytes = 1073741824\n"},
      {"default", ""},
  };
  std::error_code ec;
  std::string model_dir = std::filesystem::absolute(f.get("model-dir"), ec).string();
  std::string big_body = long_prompt_body(*prompt_tokens);
  std::printf("| gateway | round | short alone: median ms | during %lld x %lld-token prompts: "
              "first ms | median ms | max ms | count | big requests took ms |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- |\n",
              static_cast<long long>(*big), static_cast<long long>(*prompt_tokens));
  struct Summary {
    const char* name;
    double alone, first, median, big;
  };
  std::vector<Summary> summaries;
  for (const Variant& v : variants) {
    auto cluster = start_cluster(model_dir, "tandem bench admission", v.gateway_extra);
    if (!cluster.ok()) {
      std::fprintf(stderr, "%s\n", cluster.error().describe().c_str());
      return cluster.error().kind == ErrorKind::invalid ? 2 : 1;
    }
    (void)admission_round(cluster->gateway, 0, big_body, 20);  // warm-up
    std::vector<double> alone, first, median, bigs;
    for (int64_t r = 0; r < *rounds; ++r) {
      auto q = admission_round(cluster->gateway, 0, big_body, 9);
      auto l = admission_round(cluster->gateway, static_cast<uint32_t>(*big), big_body, 0);
      if (!q.ok() || !l.ok()) {
        std::fprintf(stderr, "tandem bench admission: %s; log: %s/node.log\n",
                     (!q.ok() ? q.error() : l.error()).describe().c_str(), cluster->dir.c_str());
        return 1;
      }
      alone.push_back(median_of(q->short_ms));
      first.push_back(l->short_ms.front());
      median.push_back(median_of(l->short_ms));
      bigs.push_back(l->big_ms);
      std::printf("| %s | %lld | %.3f | %.3f | %.3f | %.3f | %zu | %.1f |\n", v.name,
                  static_cast<long long>(r + 1), alone.back(), first.back(), median.back(),
                  *std::max_element(l->short_ms.begin(), l->short_ms.end()), l->short_ms.size(),
                  bigs.back());
      std::fflush(stdout);
    }
    summaries.push_back({v.name, median_of(alone), median_of(first), median_of(median),
                         median_of(bigs)});
    cluster->node.reset();
    std::filesystem::remove_all(cluster->dir, ec);
  }
  std::printf("\nmedians over rounds:\n| gateway | short alone ms | first short during the long "
              "prompts ms | its ratio to alone | median short during ms | big requests took "
              "ms |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const Summary& s : summaries) {
    std::printf("| %s | %.3f | %.3f | %.1f | %.3f | %.1f |\n", s.name, s.alone, s.first,
                s.first / std::max(s.alone, 1e-3), s.median, s.big);
  }
  return 0;
}

int run_isolation_bench(cli::Args args) {
  cli::Flags f("tandem bench isolation [--model-dir DIR] [--prompt-tokens N] [--big N] "
               "[--rounds N]",
               "How much a long prompt arriving at the gateway delays the tokens it streams:\n"
               "one stream (sim device, time factor 0) alone, then the same stream while\n"
               "--big count_tokens requests of --prompt-tokens tokens arrive. Prints the\n"
               "stream's largest gap between chunks in each case, per round, and the ratio.");
  f.flag("model-dir", "DIR", "tokenizer source (stories15M)", "models/stories15M")
      .flag("prompt-tokens", "N", "tokens per big request", "50000")
      .flag("big", "N", "big requests per loaded round", "2")
      .flag("stream-tokens", "N", "tokens of the measured stream", "4000")
      .flag("rounds", "N", "rounds (each: quiet, then loaded)", "5")
      .flag("keep", "", "keep the temp dir (manifest, node log)");
  int code = 0;
  if (!f.parse(args, &code)) return code;
  auto prompt_tokens = f.get_int("prompt-tokens");
  auto big = f.get_int("big");
  auto stream_tokens = f.get_int("stream-tokens");
  auto rounds = f.get_int("rounds");
  if (!prompt_tokens || *prompt_tokens < 1 || !big || *big < 1 || *big > 64 || !stream_tokens ||
      *stream_tokens < 2 || *stream_tokens > 4000 || !rounds || *rounds < 1) {
    std::fprintf(stderr, "tandem bench isolation: --prompt-tokens >= 1, --big 1..64, "
                         "--stream-tokens 2..4000, --rounds >= 1\n");
    return 2;
  }
  std::error_code ec;
  std::string model_dir = std::filesystem::absolute(f.get("model-dir"), ec).string();
  auto cluster = start_cluster(model_dir, "tandem bench isolation");
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.error().describe().c_str());
    return 1;
  }
  std::string big_body = long_prompt_body(*prompt_tokens);
  std::printf("| round | stream alone: max gap ms | with %lld x %lld-token prompts: max gap ms "
              "| big requests took ms | ratio |\n| --- | --- | --- | --- | --- |\n",
              static_cast<long long>(*big), static_cast<long long>(*prompt_tokens));
  int rc = 0;
  std::vector<double> quiet, loaded;
  (void)isolation_round(cluster->gateway, 64, 0, big_body);  // warm-up
  for (int64_t r = 0; r < *rounds; ++r) {
    auto q = isolation_round(cluster->gateway, static_cast<uint32_t>(*stream_tokens), 0, big_body);
    auto l = isolation_round(cluster->gateway, static_cast<uint32_t>(*stream_tokens),
                             static_cast<uint32_t>(*big), big_body);
    if (!q.ok() || !l.ok()) {
      std::fprintf(stderr, "tandem bench isolation: %s\n",
                   (!q.ok() ? q.error() : l.error()).describe().c_str());
      rc = 1;
      break;
    }
    quiet.push_back(q->quiet_gap_ms);
    loaded.push_back(l->loaded_gap_ms);
    std::printf("| %lld | %.3f | %.3f | %.1f | %.1f |\n", static_cast<long long>(r + 1),
                q->quiet_gap_ms, l->loaded_gap_ms, l->big_ms,
                l->loaded_gap_ms / std::max(q->quiet_gap_ms, 1e-3));
    std::fflush(stdout);
  }
  if (!quiet.empty()) {
    std::sort(quiet.begin(), quiet.end());
    std::sort(loaded.begin(), loaded.end());
    double qm = quiet[quiet.size() / 2], lm = loaded[loaded.size() / 2];
    std::printf("median max gap: alone %.3f ms, with long prompts %.3f ms (ratio %.1f)\n", qm, lm,
                lm / std::max(qm, 1e-3));
  }
  cluster->node.reset();
  if (!f.has("keep")) std::filesystem::remove_all(cluster->dir, ec);
  return rc;
}

int run_overhead_bench(cli::Args args) {
  cli::Flags f("tandem bench overhead [--model-dir DIR] [--requests N] [--concurrency LIST]",
               "Added latency of gateway + router + prefill/decode actors per short request\n"
               "(16 prompt tokens; 1 and 16 output tokens) on the sim device, time factor 0,\n"
               "versus the same device driven in-process. Goal: < 0.5 ms p99.");
  f.flag("model-dir", "DIR", "tokenizer source (stories15M)", "models/stories15M")
      .flag("requests", "N", "requests per point (at least 4 x concurrency are run)", "1000")
      .flag("concurrency", "LIST", "comma-separated stream counts", "1,64,1000")
      .flag("rate", "LIST", "also open loop: Poisson arrivals at these req/s, at most the "
                            "largest --concurrency in flight (e.g. 2000,5000)", "")
      .flag("no-floor", "", "skip the transport floor (a canned answer from the HTTP layer)")
      .flag("keep", "", "keep the temp dir (manifest, node log)");
  int code = 0;
  if (!f.parse(args, &code)) return code;
  auto requests = f.get_int("requests");
  if (!requests || *requests < 1 || *requests > 1000000) return 2;
  std::vector<double> rates;
  std::stringstream rate_list(f.get("rate"));
  for (std::string item; std::getline(rate_list, item, ',');) {
    char* end = nullptr;
    double v = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0' || !(v > 0) || v > 1e7) {
      std::fprintf(stderr, "tandem bench overhead: --rate: '%s' is not a rate in (0, 1e7]\n",
                   item.c_str());
      return 2;
    }
    rates.push_back(v);
  }
  std::vector<uint32_t> levels;
  std::stringstream list(f.get("concurrency"));
  for (std::string item; std::getline(list, item, ',');) {
    long v = std::strtol(item.c_str(), nullptr, 10);
    if (v < 1 || v > 20000) {
      std::fprintf(stderr, "tandem bench overhead: --concurrency: '%s' not in 1..20000\n",
                   item.c_str());
      return 2;
    }
    levels.push_back(static_cast<uint32_t>(v));
  }
  std::error_code ec;
  std::string model_dir = std::filesystem::absolute(f.get("model-dir"), ec).string();
  auto cluster = start_cluster(model_dir, "tandem bench overhead");
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.error().describe().c_str());
    return cluster.error().kind == ErrorKind::invalid ? 2 : 1;
  }
  const std::string& dir = cluster->dir;
  const HttpEndpoint& gateway = cluster->gateway;
  FloorHandler floor_handler;
  std::optional<gateway::HttpServer> floor_server;
  std::optional<HttpEndpoint> floor;
  if (!f.has("no-floor")) {
    gateway::HttpLimits limits;
    limits.connections_per_client_max = limits.connections_max;  // every stream is from loopback
    floor_server.emplace("127.0.0.1", 0, limits, floor_handler);
    if (Status st = floor_server->start(); !st.ok()) {
      std::fprintf(stderr, "tandem bench overhead: floor: %s\n", st.error().describe().c_str());
      return 1;
    }
    floor = HttpEndpoint{"127.0.0.1", floor_server->port()};
  }
  int rc = 0;
  {
    ServeBenchOptions warm;  // warm-up: connections, allocator, caches
    warm.target = gateway;
    warm.progress = false;
    warm.chain_sessions = false;
    auto wreq = workload::generate_random({7, 32000, 50, kPromptTokens, 4, 0, 0});
    if (!wreq.ok() || !run_serve_bench(*wreq, warm).ok()) {
      std::fprintf(stderr, "tandem bench overhead: warm-up failed; log: %s/node.log\n",
                   dir.c_str());
      return 1;
    }
    std::printf("%s", kTableHead);
    for (uint32_t out : {1u, 16u}) {
      for (uint32_t c : levels) {
        uint32_t n = std::max<uint32_t>(static_cast<uint32_t>(*requests), 4 * c);
        auto pt = measure(gateway, cluster->node->pid(), floor, c, out, n);
        if (!pt.ok()) {
          std::fprintf(stderr, "tandem bench overhead: %u streams: %s\n", c,
                       pt.error().describe().c_str());
          rc = 1;
          continue;
        }
        print_point(*pt);
        if (pt->cluster.failed_count > 0 || pt->floor.failed_count > 0) rc = 3;
      }
    }
    if (!rates.empty()) {
      uint32_t cap = *std::max_element(levels.begin(), levels.end());
      std::printf("\nopen loop (Poisson arrivals, at most %u in flight):\n"
                  "| offered req/s | out | requests | added p50 ms | added p99 ms | "
                  "achieved req/s | floor p50 ms | floor p99 ms | node CPU us/req |\n"
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n", cap);
      for (uint32_t out : {1u, 16u}) {
        for (double rate : rates) {
          auto n = static_cast<uint32_t>(std::max<double>(*requests, rate * 2));  // >= ~2 s
          auto pt = measure(gateway, cluster->node->pid(), floor, cap, out, n, rate);
          if (!pt.ok()) {
            std::fprintf(stderr, "tandem bench overhead: rate %.0f: %s\n", rate,
                         pt.error().describe().c_str());
            rc = 1;
            continue;
          }
          const auto& c = pt->cluster;
          std::printf("| %.0f | %u | %llu | %.3f | %.3f | %.0f | %.3f | %.3f | %.1f |\n", rate,
                      out, static_cast<unsigned long long>(c.requests_count),
                      c.e2e_ms.p50 - pt->direct.p50, c.e2e_ms.p99 - pt->direct.p99,
                      c.request_throughput_per_s, pt->floor.e2e_ms.p50, pt->floor.e2e_ms.p99,
                      pt->node_cpu_us);
          std::fflush(stdout);
          if (c.failed_count > 0 || pt->floor.failed_count > 0) rc = 3;
        }
      }
    }
  }
  cluster->node.reset();
  if (!f.has("keep")) std::filesystem::remove_all(dir, ec);
  return rc;
}

}  // namespace tandem::bench
