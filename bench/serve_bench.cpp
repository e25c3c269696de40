#include "bench/serve_bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "runtime/base/assert.hpp"

namespace tandem::bench {
namespace {

using nlohmann::json;

std::string request_body(const workload::Request& r, const ServeBenchOptions& o,
                         const std::string& model) {
  json body = {{"model", model},
               {"max_tokens", std::max<uint32_t>(1, r.expected_output_tokens)},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"temperature", 0}};
  if (o.chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", r.prompt_text}}});
  } else if (!r.prompt_text.empty()) {
    body["prompt"] = r.prompt_text;
  } else {
    body["prompt"] = workload::token_ids(r);
  }
  return body.dump();
}

Result<std::string> first_model(const HttpEndpoint& target) {
  auto got = http_get(target, "/v1/models", 10000);
  if (!got.ok()) return got.error();
  auto j = json::parse(got->second, nullptr, false);
  if (got->first != 200 || j.is_discarded() || !j.contains("data") || !j["data"].is_array() ||
      j["data"].empty() || !j["data"][0].contains("id")) {
    return make_error(ErrorKind::invalid, "GET /v1/models: no model in the answer (status " +
                                              std::to_string(got->first) + ")");
  }
  return j["data"][0]["id"].get<std::string>();
}

PrefixCounters read_prefix(const ServeBenchOptions& o) {
  PrefixCounters out;
  out.ok = true;
  std::vector<HttpEndpoint> sources = o.metrics.empty() ? std::vector{o.target} : o.metrics;
  for (const HttpEndpoint& e : sources) {
    auto got = http_get(e, "/metrics", 5000);
    if (!got.ok() || got->first != 200) {
      out.ok = false;
      continue;
    }
    out.hits_tokens += sum_metric(got->second, "tandem:prefix_cache_hits_total");
    out.queries_tokens += sum_metric(got->second, "tandem:prefix_cache_queries_total");
  }
  return out;
}

// The replay state: which requests are ready, waiting (timers), or chained behind another.
struct Replay {
  std::set<uint32_t> ready_continuing, ready_new;  // by workload index
  std::multimap<double, uint32_t> timers;          // ready time ms -> index
  std::vector<int64_t> next_in_session;            // index of turn t+1, or -1
};

Replay plan_replay(const std::vector<workload::Request>& requests, const ServeBenchOptions& o) {
  Replay replay;
  replay.next_in_session.assign(requests.size(), -1);
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> by_turn;  // (session, turn) -> index
  if (o.chain_sessions) {
    for (uint32_t i = 0; i < requests.size(); ++i) by_turn[{requests[i].session, requests[i].turn}] = i;
  }
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.request_rate_per_s > 0 ? o.request_rate_per_s : 1);
  double arrival_ms = 0;
  for (uint32_t i = 0; i < requests.size(); ++i) {
    const workload::Request& r = requests[i];
    auto prev = r.turn > 0 ? by_turn.find({r.session, r.turn - 1}) : by_turn.end();
    if (prev != by_turn.end()) {
      replay.next_in_session[prev->second] = i;
      continue;  // becomes ready when its previous turn ends
    }
    if (o.request_rate_per_s > 0) {
      replay.timers.emplace(arrival_ms, i);
      arrival_ms += gap(rng) * 1000.0;
    } else {
      replay.ready_new.insert(i);
    }
  }
  return replay;
}

workload::RequestTimeline to_timeline(const workload::Request& r, const StreamOutcome& s) {
  workload::RequestTimeline t;
  t.send_ms = s.send_ms;
  t.chunk_ms = s.chunk_ms;
  t.end_ms = std::max(s.end_ms, s.chunk_ms.empty() ? s.end_ms : s.chunk_ms.back());
  uint64_t chunks = s.chunk_ms.size();
  t.output_tokens = s.usage_seen ? s.completion_tokens : static_cast<uint32_t>(chunks);
  t.prompt_tokens = r.prompt_text.empty() ? r.prompt_tokens_count() : s.prompt_tokens;
  t.turn = r.turn;
  t.error_kind = s.error_kind;
  if (t.error_kind.empty() && t.output_tokens < chunks) {
    t.error_kind = "bad_response";  // more text events than generated tokens
  }
  return t;
}

class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled), tty_(isatty(2) == 1) {}
  void update(double now_ms, size_t done, size_t in_flight, size_t total,
              const std::vector<double>& ttft_ms, uint64_t output_tokens) {
    if (!enabled_ || now_ms < next_ms_) return;
    next_ms_ = now_ms + (tty_ ? 250 : 5000);
    double p50 = 0;
    if (!ttft_ms.empty()) {
      std::vector<double> sorted = ttft_ms;
      std::sort(sorted.begin(), sorted.end());
      p50 = workload::percentile(sorted, 50);
    }
    double secs = std::max(now_ms / 1000.0, 1e-3);
    std::fprintf(stderr, "%s[%6.1f s] %zu/%zu done, %zu in flight, TTFT p50 %.1f ms, %.1f req/s, "
                 "%.0f tok/s%s", tty_ ? "\r" : "", now_ms / 1000, done, total, in_flight, p50,
                 static_cast<double>(done) / secs, static_cast<double>(output_tokens) / secs,
                 tty_ ? "   " : "\n");
    std::fflush(stderr);
  }
  void end() {
    if (enabled_ && tty_) std::fputc('\n', stderr);
  }

 private:
  bool enabled_, tty_;
  double next_ms_ = 0;
};

bool take_ready(Replay& replay, uint32_t* index) {
  std::set<uint32_t>& from = replay.ready_continuing.empty() ? replay.ready_new
                                                             : replay.ready_continuing;
  if (from.empty()) return false;
  *index = *from.begin();
  from.erase(from.begin());
  return true;
}

}  // namespace

double sum_metric(const std::string& text, const std::string& metric) {
  double total = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(metric, 0) != 0) continue;
    char next = line.size() > metric.size() ? line[metric.size()] : '\0';
    if (next != ' ' && next != '{') continue;  // a longer name with the same prefix
    size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    total += std::strtod(line.c_str() + space + 1, nullptr);
  }
  return total;
}

Result<ServeBenchResult> run_serve_bench(const std::vector<workload::Request>& all,
                                         const ServeBenchOptions& o) {
  if (all.empty()) return make_error(ErrorKind::invalid, "the workload has no requests");
  if (o.concurrency == 0) return make_error(ErrorKind::invalid, "--concurrency must be >= 1");
  std::vector<workload::Request> requests(
      all.begin(), all.begin() + (o.requests_max > 0 ? std::min<size_t>(o.requests_max, all.size())
                                                     : all.size()));
  ServeBenchResult result;
  if (o.model.empty()) {
    auto model = first_model(o.target);
    if (!model.ok()) return model.error();
    result.model = *model;
  } else {
    result.model = o.model;
  }
  result.prefix_before = read_prefix(o);
  Replay replay = plan_replay(requests, o);
  StreamClient client(o.target, o.timeout_s * 1000.0);
  Progress progress(o.progress);
  std::vector<double> ttfts;
  uint64_t output_tokens = 0;
  size_t in_flight = 0;
  std::vector<size_t> slot_of(requests.size(), SIZE_MAX);  // workload index -> timeline
  double stop_ms = o.duration_s > 0 ? o.duration_s * 1000.0 : INFINITY;
  while (true) {
    double now = client.now_ms();
    while (!replay.timers.empty() && replay.timers.begin()->first <= now) {
      auto it = replay.timers.begin();
      (requests[it->second].turn > 0 ? replay.ready_continuing : replay.ready_new)
          .insert(it->second);
      replay.timers.erase(it);
    }
    uint32_t index = 0;
    while (now < stop_ms && in_flight < o.concurrency && take_ready(replay, &index)) {
      client.start(index, StreamCall{o.chat ? "/v1/chat/completions" : "/v1/completions",
                                     request_body(requests[index], o, result.model), o.chat});
      slot_of[index] = result.timelines.size();
      result.request_indexes.push_back(index);
      result.timelines.emplace_back();
      ++in_flight;
    }
    bool more = now < stop_ms && (!replay.timers.empty() || !replay.ready_new.empty() ||
                                  !replay.ready_continuing.empty());
    if (in_flight == 0 && !more) break;
    double wait = replay.timers.empty() ? 50 : std::clamp(replay.timers.begin()->first - now, 0.0, 50.0);
    for (auto& [tag, outcome] : client.poll(in_flight == 0 ? wait : std::min(wait, 20.0))) {
      RT_ASSERT(in_flight > 0, "a call finished with none in flight");
      --in_flight;
      RT_ASSERT(tag < slot_of.size() && slot_of[tag] != SIZE_MAX, "finished call started", tag);
      const workload::Request& r = requests[tag];
      auto& t = result.timelines[slot_of[tag]];
      t = to_timeline(r, outcome);
      if (!t.error_kind.empty()) result.error_examples.emplace(t.error_kind, outcome.error_detail);
      if (t.error_kind.empty() && !t.chunk_ms.empty()) ttfts.push_back(t.chunk_ms[0] - t.send_ms);
      output_tokens += t.output_tokens;
      int64_t next = replay.next_in_session[tag];
      if (next >= 0) {
        double think = o.use_think_time ? requests[static_cast<size_t>(next)].think_time_ms : 0;
        replay.timers.emplace(client.now_ms() + think, static_cast<uint32_t>(next));
      }
    }
    progress.update(client.now_ms(), result.timelines.size() - in_flight, in_flight,
                    requests.size(), ttfts, output_tokens);
  }
  progress.end();
  result.prefix_after = read_prefix(o);
  double queries = result.prefix_after.queries_tokens - result.prefix_before.queries_tokens;
  if (result.prefix_before.ok && result.prefix_after.ok && queries > 0) {
    result.prefix_hit_rate =
        (result.prefix_after.hits_tokens - result.prefix_before.hits_tokens) / queries;
  }
  auto summary = workload::summarize(result.timelines, o.summary);
  if (!summary.ok()) return summary.error();
  result.summary = std::move(summary).value();
  RT_ASSERT(result.summary.requests_count == result.timelines.size(), "every request counted");
  return result;
}

}  // namespace tandem::bench
