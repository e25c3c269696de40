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
// Closed-loop session replay (chain_sessions, no request rate) admits sessions, not requests:
// the first `concurrency` sessions start at their first turn's arrival offset (the
// workload's stagger) and hold a slot until their last turn ends, think times included;
// then the next session (workload order) takes the slot -- as `tandem sim` does.
struct Replay {
  std::set<uint32_t> ready_continuing, ready_new;  // by workload index
  std::multimap<double, uint32_t> timers;          // ready time ms -> index
  std::vector<int64_t> next_in_session;            // index of turn t+1, or -1
  bool session_slots = false;                      // closed-loop session replay (above)
  std::set<uint32_t> admitted_first_turns;         // first wave: own a slot from the start
  size_t sessions_active = 0;                      // sessions holding a slot
};

Replay plan_replay(const std::vector<workload::Request>& requests, const ServeBenchOptions& o) {
  Replay replay;
  replay.next_in_session.assign(requests.size(), -1);
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> by_turn;  // (session, turn) -> index
  if (o.chain_sessions) {
    for (uint32_t i = 0; i < requests.size(); ++i) {
      by_turn[{requests[i].session, requests[i].turn}] = i;
    }
  }
  replay.session_slots = o.chain_sessions && o.request_rate_per_s <= 0;
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
    } else if (replay.session_slots && replay.sessions_active < o.concurrency) {
      replay.timers.emplace(std::max(0.0, r.arrival_offset_ms), i);
      replay.admitted_first_turns.insert(i);
      ++replay.sessions_active;
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
  t.cached_tokens = std::min<uint64_t>(s.cached_tokens, t.prompt_tokens);
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

// The next request to send: a turn of a session that holds a slot first, else a new
// session's first turn (with session slots: only while a slot is free, and it takes it).
bool take_ready(Replay& replay, size_t concurrency, uint32_t* index) {
  bool continuing = !replay.ready_continuing.empty();
  if (!continuing && replay.session_slots && replay.sessions_active >= concurrency) return false;
  std::set<uint32_t>& from = continuing ? replay.ready_continuing : replay.ready_new;
  if (from.empty()) return false;
  *index = *from.begin();
  from.erase(from.begin());
  if (!continuing && replay.session_slots) ++replay.sessions_active;
  RT_ASSERT(!replay.session_slots || replay.sessions_active <= concurrency,
            replay.sessions_active);
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

namespace {

// One replay: the loop's state, split into steps.
class Runner {
 public:
  Runner(const std::vector<workload::Request>& requests, const ServeBenchOptions& o,
         ServeBenchResult& result)
      : requests_(requests),
        o_(o),
        result_(result),
        replay_(plan_replay(requests, o)),
        client_(o.target, o.timeout_s * 1000.0),
        progress_(o.progress),
        slot_of_(requests.size(), SIZE_MAX),
        attempts_(requests.size(), 0),
        first_send_ms_(requests.size(), -1.0),
        stop_ms_(o.duration_s > 0 ? o.duration_s * 1000.0 : INFINITY) {}

  void run() {
    while (true) {
      double now = client_.now_ms();
      release_timers(now);
      send_retries(now);
      issue(now);
      bool more = now < stop_ms_ && (!replay_.timers.empty() || !replay_.ready_new.empty() ||
                                     !replay_.ready_continuing.empty());
      if (in_flight_ == 0 && !more) break;
      double wait = replay_.timers.empty()
                        ? 50
                        : std::clamp(replay_.timers.begin()->first - now, 0.0, 50.0);
      if (!retry_at_.empty()) wait = std::clamp(retry_at_.begin()->first - now, 0.0, wait);
      for (auto& [tag, outcome] : client_.poll(in_flight_ == 0 ? wait : std::min(wait, 20.0))) {
        on_finished(tag, outcome);
      }
      progress_.update(client_.now_ms(), result_.timelines.size() - in_flight_, in_flight_,
                       requests_.size(), ttfts_ms_, output_tokens_);
    }
    progress_.end();
  }

 private:
  void release_timers(double now) {
    while (!replay_.timers.empty() && replay_.timers.begin()->first <= now) {
      auto it = replay_.timers.begin();
      bool continuing = requests_[it->second].turn > 0 ||
                        replay_.admitted_first_turns.count(it->second) > 0;
      (continuing ? replay_.ready_continuing : replay_.ready_new).insert(it->second);
      replay_.timers.erase(it);
    }
  }

  // Refused before it started: nothing reached a model, so sending it again loses nothing.
  static bool refused(const StreamOutcome& outcome) {
    return outcome.error_kind == "connect" || outcome.error_kind == "http_503" ||
           outcome.error_kind == "http_429";
  }

  void send_retries(double now) {
    while (!retry_at_.empty() && retry_at_.begin()->first <= now) {
      uint32_t index = retry_at_.begin()->second;
      retry_at_.erase(retry_at_.begin());
      send(index);
    }
  }

  void send(uint32_t index) {
    client_.start(index, StreamCall{o_.chat ? "/v1/chat/completions" : "/v1/completions",
                                    request_body(requests_[index], o_, result_.model), o_.chat});
  }

  void issue(double now) {
    uint32_t index = 0;
    while (now < stop_ms_ && in_flight_ < o_.concurrency &&
           take_ready(replay_, o_.concurrency, &index)) {
      RT_ASSERT(slot_of_[index] == SIZE_MAX, "a request is sent once", index);
      first_send_ms_[index] = client_.now_ms();
      send(index);
      slot_of_[index] = result_.timelines.size();
      result_.request_indexes.push_back(index);
      result_.timelines.emplace_back();
      ++in_flight_;
    }
  }

  void on_finished(uint64_t tag, const StreamOutcome& outcome) {
    RT_ASSERT(in_flight_ > 0, "a call finished with none in flight");
    RT_ASSERT(tag < slot_of_.size() && slot_of_[tag] != SIZE_MAX, "finished call started", tag);
    if (refused(outcome) && attempts_[tag] < o_.retries_max) {
      // Still in flight (its concurrency slot stays taken) until the retry's outcome.
      double backoff_ms =
          std::min(4000.0, 250.0 * static_cast<double>(1u << std::min(attempts_[tag], 4u)));
      ++attempts_[tag];
      ++result_.retries;
      ++result_.retried_by_kind[outcome.error_kind];
      retry_at_.emplace(client_.now_ms() + backoff_ms, static_cast<uint32_t>(tag));
      RT_ASSERT(retry_at_.size() <= in_flight_, retry_at_.size(), in_flight_);
      return;
    }
    --in_flight_;
    workload::RequestTimeline& t = result_.timelines[slot_of_[tag]];
    t = to_timeline(requests_[tag], outcome);
    RT_ASSERT(first_send_ms_[tag] >= 0, tag);
    t.send_ms = first_send_ms_[tag];  // the wait for retries counts in its latency
    if (!t.error_kind.empty()) result_.error_examples.emplace(t.error_kind, outcome.error_detail);
    if (t.error_kind.empty() && !t.chunk_ms.empty()) ttfts_ms_.push_back(t.chunk_ms[0] - t.send_ms);
    output_tokens_ += t.output_tokens;
    int64_t next = replay_.next_in_session[tag];
    if (next < 0 && replay_.session_slots) {
      RT_ASSERT(replay_.sessions_active > 0, "a session ended without a slot", tag);
      --replay_.sessions_active;  // its last turn: the slot goes to the next session
    }
    if (next >= 0) {
      double think = o_.use_think_time ? requests_[static_cast<size_t>(next)].think_time_ms : 0;
      replay_.timers.emplace(client_.now_ms() + think, static_cast<uint32_t>(next));
    }
  }

  const std::vector<workload::Request>& requests_;
  const ServeBenchOptions& o_;
  ServeBenchResult& result_;
  Replay replay_;
  StreamClient client_;
  Progress progress_;
  std::vector<size_t> slot_of_;  // workload index -> timeline index
  std::vector<uint32_t> attempts_;            // retries so far, per workload index
  std::vector<double> first_send_ms_;         // per workload index; -1 before it is sent
  std::multimap<double, uint32_t> retry_at_;  // due time -> workload index; <= in flight
  double stop_ms_;
  size_t in_flight_ = 0;
  std::vector<double> ttfts_ms_;
  uint64_t output_tokens_ = 0;
};

}  // namespace

Result<ServeBenchResult> run_serve_bench(const std::vector<workload::Request>& all,
                                         const ServeBenchOptions& o) {
  if (all.empty()) return make_error(ErrorKind::invalid, "the workload has no requests");
  if (o.concurrency == 0) return make_error(ErrorKind::invalid, "--concurrency must be >= 1");
  size_t count = o.requests_max > 0 ? std::min<size_t>(o.requests_max, all.size()) : all.size();
  std::vector<workload::Request> requests(all.begin(), all.begin() + static_cast<long>(count));
  ServeBenchResult result;
  result.model = o.model;
  if (o.model.empty()) {
    auto model = first_model(o.target);
    if (!model.ok()) return model.error();
    result.model = *model;
  }
  result.prefix_before = read_prefix(o);
  Runner(requests, o, result).run();
  result.prefix_after = read_prefix(o);
  double queries = result.prefix_after.queries_tokens - result.prefix_before.queries_tokens;
  if (result.prefix_before.ok && result.prefix_after.ok && queries > 0) {
    result.prefix_hit_rate =
        (result.prefix_after.hits_tokens - result.prefix_before.hits_tokens) / queries;
  }
  uint64_t prompt_sum = 0, cached_sum = 0;
  for (const auto& t : result.timelines) {
    if (!t.error_kind.empty()) continue;
    prompt_sum += t.prompt_tokens;
    cached_sum += t.cached_tokens;
  }
  if (prompt_sum > 0) result.request_hit_rate = double(cached_sum) / double(prompt_sum);
  auto summary = workload::summarize(result.timelines, o.summary);
  if (!summary.ok()) return summary.error();
  result.summary = std::move(summary).value();
  RT_ASSERT(result.summary.requests_count == result.timelines.size(), "every request counted");
  RT_ASSERT(result.request_indexes.size() == result.timelines.size(), "one index per timeline");
  return result;
}

}  // namespace tandem::bench
