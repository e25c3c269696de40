// `tandem bench serve` (issue 5): a real HTTP client of the gateway that replays a workload
// (tools/workload generators or a JSONL trace) at a concurrency or a request rate, for a
// duration or a request count, and measures per request TTFT, TPOT, ITL and end-to-end
// latency (tools/workload/bench_metrics does the arithmetic).
//
// Replay rules:
//   - at most `concurrency` requests are in flight;
//   - chain_sessions: turn t of a session is sent only after turn t-1 ended (plus its
//     think_time_ms when use_think_time); continuing sessions go before new ones. In a
//     closed loop (no request rate) `concurrency` is the number of sessions in flight, think
//     times included: the first `concurrency` sessions start at their first turn's
//     arrival_offset_ms, and a new session starts only when one has sent its last turn and
//     that turn ended (as `tandem sim` replays sessions);
//   - request_rate_per_s > 0: first turns / unchained requests arrive as a Poisson process
//     (seeded); 0: they are all ready at the start (closed loop);
//   - duration_s > 0: no new request starts after it; those in flight finish.
// One thread; I/O through bench/http_stream (epoll). Prints progress to stderr.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/http_stream.hpp"
#include "runtime/base/result.hpp"
#include "tools/cli.hpp"
#include "tools/workload/bench_metrics.hpp"
#include "tools/workload/workload.hpp"

namespace tandem::bench {

struct ServeBenchOptions {
  HttpEndpoint target;
  std::vector<HttpEndpoint> metrics;  // /metrics sources for the prefix hit rate; empty: target
  std::string model;                  // "": the first id of GET /v1/models
  bool chat = false;                  // /v1/chat/completions (text prompts only) vs completions
  uint32_t concurrency = 8;
  double request_rate_per_s = 0;
  double duration_s = 0;       // 0: until every request ran
  uint32_t requests_max = 0;   // 0: the whole workload
  bool chain_sessions = true;
  bool use_think_time = true;
  double timeout_s = 600;      // per request
  // A request the cluster refused without starting it (no connection: connect refused; or an
  // HTTP 503/429 answer before any token, e.g. a draining gateway's 503 shutting_down) is
  // sent again after 0.25 s, doubling up to 4 s, at most this many times (what the official
  // SDKs do with their max_retries). Its timeline keeps the first send time.
  uint32_t retries_max = 0;
  uint64_t seed = 1;           // Poisson arrivals
  bool progress = true;
  workload::SummaryOptions summary;
};

// Token-weighted prefix cache counters summed over every `tandem:prefix_cache_*` series.
struct PrefixCounters {
  double hits_tokens = 0;
  double queries_tokens = 0;
  bool ok = false;  // every /metrics source answered
};

struct ServeBenchResult {
  std::string model;
  std::vector<workload::RequestTimeline> timelines;  // in issue order
  std::vector<uint32_t> request_indexes;             // workload index of each timeline
  workload::BenchSummary summary;
  PrefixCounters prefix_before, prefix_after;
  double prefix_hit_rate = -1;  // (hits after - before) / (queries after - before); -1 unknown
  // Prompt tokens not computed / prompt tokens, over the succeeded requests' usage
  // (prompt_tokens_details.cached_tokens): the cluster-level hit rate, the same definition
  // as `tandem sim`'s hit_rate. -1 when no request succeeded.
  double request_hit_rate = -1;
  std::map<std::string, std::string> error_examples;  // kind -> one detail
  uint64_t retries = 0;                               // sends again after a refusal (retries_max)
  std::map<std::string, uint64_t> retried_by_kind;    // what was retried: connect, http_503, ...
};

// Errors: invalid (empty workload, zero concurrency, no model found), disconnected (the
// gateway is not reachable for /v1/models), and summarize()'s errors.
Result<ServeBenchResult> run_serve_bench(const std::vector<workload::Request>& requests,
                                         const ServeBenchOptions& options);

// The summary as text (a table) and as JSON (summary, per-request timelines, options).
std::string describe(const ServeBenchResult& result);
std::string to_json(const ServeBenchResult& result, const ServeBenchOptions& options);
// An SVG plot of the TTFT CDF (ms on x, fraction on y).
std::string ttft_cdf_svg(const ServeBenchResult& result);

// Sums the value of every sample of `metric` (any labels) in Prometheus text.
double sum_metric(const std::string& prometheus_text, const std::string& metric);

// The workload flags of `tandem bench serve` (--workload, --trace, --requests, --seed,
// --vocab, --input-tokens, ..., --sessions, --turns-min/max), shared with `tandem bench sweep`.
void declare_workload_flags(cli::Flags& flags, const std::string& workload_default);
// The workload those flags describe (a generator, or --trace read from disk); agentic
// sessions are staggered for `sessions_in_flight` slots. Errors: invalid (a bad flag value,
// an unknown kind, a bad trace line naming the line), not_found (trace unreadable).
Result<std::vector<workload::Request>> make_workload(const cli::Flags& flags,
                                                     uint32_t sessions_in_flight);

// `tandem bench serve ...` (flags: see --help).
int run_serve_bench_cli(cli::Args args);

}  // namespace tandem::bench
