// `tandem bench serve`: flags -> workload + ServeBenchOptions -> run -> text/JSON/SVG.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "bench/serve_bench.hpp"

#include "bench/plot_files.hpp"
#include "bench/request_plots.hpp"

namespace tandem::bench {
namespace {

void declare_flags(cli::Flags& f) {
  f.flag("target", "HOST:PORT", "the gateway", "127.0.0.1:8000")
      .flag("metrics", "LIST", "comma-separated HOST:PORT of /metrics sources (default: target)")
      .flag("model", "NAME", "model name (default: the first of GET /v1/models)")
      .flag("api", "KIND", "completions (token-id or text prompts) or chat (text prompts)",
            "completions")
      .flag("write-trace", "FILE", "write the workload as a JSONL trace, then run it")
      .flag("concurrency", "N", "requests (agentic: sessions) in flight at most", "8")
      .flag("request-rate", "R", "Poisson arrivals per second; 0 = closed loop", "0")
      .flag("duration", "S", "stop starting requests after S seconds; 0 = run all", "0")
      .flag("no-think-time", "", "send a session's next turn as soon as the last one ends")
      .flag("timeout", "S", "per-request timeout", "600")
      .flag("retries", "N",
            "send a request refused before it started (connect refused, HTTP 503/429) again "
            "up to N times, 0.25 s doubling to 4 s apart, as the official SDKs do",
            "0")
      .flag("slo-ttft-ms", "MS", "goodput SLO on TTFT")
      .flag("slo-tpot-ms", "MS", "goodput SLO on TPOT")
      .flag("slo-e2e-ms", "MS", "goodput SLO on end-to-end latency")
      .flag("json", "FILE", "write the result (summary + per request) as JSON")
      .flag("svg", "FILE", "write the TTFT CDF as SVG")
      .flag("svg-dir", "DIR", "write every plot (TTFT CDF, over time, vs context) as SVG")
      .flag("no-progress", "", "no progress output");
  declare_workload_flags(f, "random");
}

// Reads an integer flag into *out; false (message printed) when bad or outside [lo, hi].
bool get_u32(const cli::Flags& f, const char* name, int64_t lo, int64_t hi, uint32_t* out) {
  auto v = f.get_int(name);
  if (!v) return false;
  if (*v < lo || *v > hi) {
    std::fprintf(stderr, "tandem bench serve: --%s must be in %lld..%lld\n", name,
                 static_cast<long long>(lo), static_cast<long long>(hi));
    return false;
  }
  *out = static_cast<uint32_t>(*v);
  return true;
}

}  // namespace

void declare_workload_flags(cli::Flags& f, const std::string& workload_default) {
  f.flag("workload", "KIND", "agentic, random or shared-prefix (ignored with --trace)",
         workload_default)
      .flag("trace", "FILE", "replay a JSONL trace instead of generating")
      .flag("requests", "N", "run at most the first N requests; 0 = all", "0")
      .flag("seed", "N", "workload and arrival seed", "1")
      .flag("vocab", "N", "token ids drawn from [0, N) (the model's vocab)", "32000")
      .flag("input-tokens", "N", "random: prompt tokens", "128")
      .flag("output-tokens", "N", "random, shared-prefix: output tokens", "64")
      .flag("range-ratio", "R", "random: lengths uniform in x(1-R)..x(1+R)", "0")
      .flag("prefix-tokens", "N", "shared-prefix: shared prefix tokens", "2048")
      .flag("suffix-tokens", "N", "shared-prefix: unique suffix tokens", "256")
      .flag("groups", "N", "shared-prefix: distinct prefixes", "8")
      .flag("sessions", "N", "agentic: sessions in total", "64")
      .flag("turns-max", "N", "agentic: most turns per session", "80")
      .flag("turns-min", "N", "agentic: fewest turns per session", "20");
}

Result<std::vector<workload::Request>> make_workload(const cli::Flags& f,
                                                     uint32_t sessions_in_flight) {
  if (f.has("trace")) {
    std::ifstream in(f.get("trace"));
    if (!in) return make_error(ErrorKind::not_found, "--trace: cannot read " + f.get("trace"));
    std::stringstream ss;
    ss << in.rdbuf();
    auto read = workload::read_jsonl(ss.str());
    if (!read.ok()) {
      return make_error(ErrorKind::invalid, f.get("trace") + ": " + read.error().message);
    }
    return read;
  }
  std::string kind = f.get("workload");
  uint32_t seed = 0, vocab = 0, in = 0, out = 0;
  bool ok = get_u32(f, "seed", 0, UINT32_MAX, &seed) && get_u32(f, "vocab", 2, 1 << 24, &vocab) &&
            get_u32(f, "input-tokens", 1, 1 << 24, &in) &&
            get_u32(f, "output-tokens", 1, 1 << 20, &out);
  if (!ok) return make_error(ErrorKind::invalid, "bad workload flag");
  if (kind == "random") {
    workload::RandomParams p;
    p.seed = seed, p.vocab_size = vocab, p.input_tokens = in, p.output_tokens = out;
    if (!get_u32(f, "requests", 0, 1 << 24, &p.requests_count)) {
      return make_error(ErrorKind::invalid, "--requests");
    }
    if (p.requests_count == 0) p.requests_count = 1000;
    auto r = f.get_double("range-ratio");
    if (!r) return make_error(ErrorKind::invalid, "--range-ratio");
    p.range_ratio = *r;
    return workload::generate_random(p);
  }
  if (kind == "shared-prefix") {
    workload::SharedPrefixParams p;
    p.seed = seed, p.vocab_size = vocab, p.output_tokens = out;
    if (!get_u32(f, "prefix-tokens", 1, 1 << 24, &p.prefix_tokens) ||
        !get_u32(f, "suffix-tokens", 1, 1 << 24, &p.suffix_tokens) ||
        !get_u32(f, "groups", 1, 1 << 20, &p.groups_count)) {
      return make_error(ErrorKind::invalid, "bad shared-prefix flag");
    }
    return workload::generate_shared_prefix(p);
  }
  if (kind == "agentic") {
    workload::AgenticParams p;
    p.seed = seed, p.vocab_size = vocab;
    p.sessions_in_flight = sessions_in_flight;
    if (!get_u32(f, "sessions", 1, 1 << 20, &p.sessions_count) ||
        !get_u32(f, "turns-min", 1, 100000, &p.turns_min) ||
        !get_u32(f, "turns-max", 1, 100000, &p.turns_max)) {
      return make_error(ErrorKind::invalid, "bad agentic flag");
    }
    return workload::generate_agentic(p);
  }
  return make_error(ErrorKind::invalid, "--workload: '" + kind +
                                            "' is not agentic, random or shared-prefix");
}

namespace {

bool read_options(const cli::Flags& f, ServeBenchOptions& o) {
  auto target = parse_endpoint(f.get("target"), "--target");
  if (!target.ok()) return std::fprintf(stderr, "%s\n", target.error().message.c_str()), false;
  o.target = *target;
  std::stringstream list(f.get("metrics"));
  for (std::string item; std::getline(list, item, ',');) {
    auto e = parse_endpoint(item, "--metrics");
    if (!e.ok()) return std::fprintf(stderr, "%s\n", e.error().message.c_str()), false;
    o.metrics.push_back(*e);
  }
  o.model = f.get("model");
  if (f.get("api") != "completions" && f.get("api") != "chat") {
    return std::fprintf(stderr, "--api: '%s' is not completions or chat\n", f.get("api").c_str()),
           false;
  }
  o.chat = f.get("api") == "chat";
  auto rate = f.get_double("request-rate"), duration = f.get_double("duration");
  auto timeout = f.get_double("timeout");
  if (!rate || !duration || !timeout || *rate < 0 || *duration < 0 || *timeout <= 0) {
    return std::fprintf(stderr, "--request-rate, --duration >= 0 and --timeout > 0\n"), false;
  }
  o.request_rate_per_s = *rate, o.duration_s = *duration, o.timeout_s = *timeout;
  uint32_t seed = 0;
  if (!get_u32(f, "concurrency", 1, 1 << 20, &o.concurrency) ||
      !get_u32(f, "requests", 0, 1 << 30, &o.requests_max) ||
      !get_u32(f, "retries", 0, 100, &o.retries_max) || !get_u32(f, "seed", 0, UINT32_MAX, &seed)) {
    return false;
  }
  o.seed = seed;
  o.use_think_time = !f.has("no-think-time");
  o.chain_sessions = f.has("trace") || f.get("workload") == "agentic";
  o.progress = !f.has("no-progress");
  for (auto [name, slot] : {std::pair{"slo-ttft-ms", &o.summary.slo.ttft_ms_max},
                            std::pair{"slo-tpot-ms", &o.summary.slo.tpot_ms_max},
                            std::pair{"slo-e2e-ms", &o.summary.slo.e2e_ms_max}}) {
    if (!f.has(name)) continue;
    auto v = f.get_double(name);
    if (!v || *v <= 0) return std::fprintf(stderr, "--%s must be > 0\n", name), false;
    *slot = *v;
  }
  return true;
}

bool write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) std::fprintf(stderr, "tandem bench serve: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

}  // namespace

int run_serve_bench_cli(cli::Args args) {
  cli::Flags f("tandem bench serve [flags]",
               "Replays a workload against a running gateway (streaming SSE) and reports\n"
               "TTFT, TPOT, ITL, end-to-end latency, throughput, goodput, errors and the\n"
               "prefix hit rate from /metrics. See docs/benchmarks.md.");
  declare_flags(f);
  int code = 0;
  if (!f.parse(args, &code)) return code;
  ServeBenchOptions options;
  if (!read_options(f, options)) return 2;
  auto requests = make_workload(f, options.concurrency);
  if (!requests.ok()) {
    std::fprintf(stderr, "tandem bench serve: %s\n", requests.error().message.c_str());
    return 2;
  }
  if (f.has("write-trace") && !write_text(f.get("write-trace"), workload::to_jsonl(*requests))) {
    return 1;
  }
  auto result = run_serve_bench(*requests, options);
  if (!result.ok()) {
    std::fprintf(stderr, "tandem bench serve: %s\n", result.error().describe().c_str());
    return 1;
  }
  std::fputs(describe(*result).c_str(), stdout);
  if (f.has("json") && !write_text(f.get("json"), to_json(*result, options))) return 1;
  if (f.has("svg") && !write_text(f.get("svg"), ttft_cdf_svg(*result))) return 1;
  if (f.has("svg-dir")) {
    Status wrote = write_files(f.get("svg-dir"), request_plots(result->timelines, result->model));
    if (!wrote) {
      std::fprintf(stderr, "tandem bench serve: --svg-dir: %s\n", wrote.error().message.c_str());
      return 1;
    }
  }
  return result->summary.failed_count == 0 ? 0 : 3;
}

}  // namespace tandem::bench
