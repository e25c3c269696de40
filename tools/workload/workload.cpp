#include "tools/workload/workload.hpp"
#include "runtime/base/mix.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

namespace tandem::workload {
namespace {

// Seeds for independent streams: derive(seed, tag, index) never depends on draw order.
enum class Stream : uint64_t { system = 1, repo, session, task, assistant, tool, request, group };
uint64_t derive(uint64_t seed, Stream stream, uint64_t a, uint64_t b = 0) {
  uint64_t tagged = mix64(mix64(seed) ^ static_cast<uint64_t>(stream));
  return mix64(tagged ^ mix64(a + 0x51ed27)) ^ mix64(b);
}

// Platform-independent random draws (std distributions differ between libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix64(state_);
  }
  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint32_t uniform_int(uint32_t lo, uint32_t hi) {                              // inclusive
    RT_ASSERT(lo <= hi, lo, hi);
    uint64_t span = uint64_t{hi} - lo + 1;
    return lo + static_cast<uint32_t>((static_cast<unsigned __int128>(next()) * span) >> 64);
  }
  double normal() {                 // Box-Muller
    double u1 = 1.0 - uniform01();  // (0, 1]
    double u2 = uniform01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  double lognormal(double median, double sigma) { return median * std::exp(sigma * normal()); }
  double exponential(double mean) { return -mean * std::log(1.0 - uniform01()); }

 private:
  uint64_t state_;
};

uint32_t clamp_tokens(double value, uint32_t lo, uint32_t hi) {
  double rounded = std::round(value);
  if (rounded < lo) return lo;
  if (rounded > hi) return hi;
  return static_cast<uint32_t>(rounded);
}

Error bad(const std::string& what) {
  return make_error(ErrorKind::invalid, "workload: " + what);
}

Status check_agentic(const AgenticParams& p) {
  if (p.vocab_size < 2) return bad("vocab_size must be >= 2");
  if (p.sessions_count < 1) return bad("sessions_count must be >= 1");
  if (p.sessions_in_flight < 1) return bad("sessions_in_flight must be >= 1");
  if (p.repos_count < 1) return bad("repos_count must be >= 1");
  if (!(p.repo_popularity_zipf_s >= 0)) return bad("repo_popularity_zipf_s must be >= 0");
  if (p.repo_context_tokens_min > p.repo_context_tokens_max) {
    return bad("repo_context_tokens_min must be <= repo_context_tokens_max");
  }
  if (!(p.task_tokens_median >= 1) || !(p.tool_output_tokens_median >= 1)) {
    return bad("task_tokens_median and tool_output_tokens_median must be >= 1");
  }
  if (!(p.task_tokens_sigma >= 0) || !(p.tool_output_tokens_sigma >= 0) ||
      !(p.think_time_ms_sigma >= 0)) {
    return bad("the sigma parameters must be >= 0");
  }
  if (p.tool_output_tokens_max < 1) return bad("tool_output_tokens_max must be >= 1");
  if (p.output_tokens_min < 1 || p.output_tokens_min > p.output_tokens_max) {
    return bad("output_tokens_min must be in 1..output_tokens_max");
  }
  if (p.turns_min < 1 || p.turns_min > p.turns_max) return bad("turns_min must be in 1..turns_max");
  if (!(p.think_time_ms_median >= 0) || !(p.session_start_stagger_ms >= 0)) {
    return bad("think_time_ms_median and session_start_stagger_ms must be >= 0");
  }
  uint64_t first_turn_max = uint64_t{p.system_prompt_tokens} + p.repo_context_tokens_max +
                            static_cast<uint64_t>(p.task_tokens_median * 20) + p.output_tokens_max;
  if (first_turn_max > p.context_tokens_max) {
    return bad("context_tokens_max " + std::to_string(p.context_tokens_max) +
               " cannot hold a first turn (system + largest repo context + task + output)");
  }
  return {};
}

struct SessionPlan {
  uint32_t session = 0;
  uint32_t repo = 0;
  std::vector<Segment> base;  // system, repo, task
};

uint32_t pick_repo(const std::vector<double>& cumulative, Rng& rng) {
  double u = rng.uniform01() * cumulative.back();
  auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
  RT_ASSERT(it != cumulative.end(), u);
  auto repo = static_cast<uint32_t>(it - cumulative.begin());
  RT_ASSERT(repo < cumulative.size(), repo);
  return repo;
}

// Emits one session's turns starting at start_ms; returns the time its slot frees up.
double emit_session(const AgenticParams& p, const SessionPlan& plan, Rng& rng, double start_ms,
                    std::vector<Request>& out) {
  uint32_t turns = rng.uniform_int(p.turns_min, p.turns_max);
  std::vector<Segment> prompt = plan.base;
  uint64_t prompt_tokens = 0;
  for (const Segment& s : prompt) prompt_tokens += s.tokens_count;
  double arrival_ms = start_ms;
  uint32_t previous_output = 0;
  for (uint32_t turn = 0; turn < turns; ++turn) {
    double think_ms = 0;
    if (turn > 0) {
      uint32_t tool =
          clamp_tokens(rng.lognormal(p.tool_output_tokens_median, p.tool_output_tokens_sigma), 1,
                       p.tool_output_tokens_max);
      think_ms = rng.lognormal(p.think_time_ms_median, p.think_time_ms_sigma);
      prompt.push_back({SegmentKind::assistant,
                        derive(p.seed, Stream::assistant, plan.session, turn - 1), previous_output,
                        p.vocab_size});
      prompt.push_back({SegmentKind::tool, derive(p.seed, Stream::tool, plan.session, turn), tool,
                        p.vocab_size});
      prompt_tokens += uint64_t{previous_output} + tool;
      arrival_ms += think_ms;
    }
    uint32_t output = rng.uniform_int(p.output_tokens_min, p.output_tokens_max);
    if (prompt_tokens + output > p.context_tokens_max) break;  // the session is out of context
    Request request;
    request.session = plan.session;
    request.turn = turn;
    request.repo = static_cast<int32_t>(plan.repo);
    request.arrival_offset_ms = arrival_ms;
    request.think_time_ms = think_ms;
    request.expected_output_tokens = output;
    request.segments = prompt;
    out.push_back(std::move(request));
    previous_output = output;
  }
  RT_ASSERT(prompt_tokens <=
            uint64_t{p.context_tokens_max} + p.tool_output_tokens_max + p.output_tokens_max);
  return arrival_ms + rng.lognormal(p.think_time_ms_median, p.think_time_ms_sigma);
}

void sort_by_arrival(std::vector<Request>& requests) {
  std::stable_sort(requests.begin(), requests.end(), [](const Request& a, const Request& b) {
    if (a.arrival_offset_ms != b.arrival_offset_ms) {
      return a.arrival_offset_ms < b.arrival_offset_ms;
    }
    if (a.session != b.session) return a.session < b.session;
    return a.turn < b.turn;
  });
}

}  // namespace

std::string_view to_string(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::system:
      return "system";
    case SegmentKind::repo:
      return "repo";
    case SegmentKind::task:
      return "task";
    case SegmentKind::assistant:
      return "assistant";
    case SegmentKind::tool:
      return "tool";
    case SegmentKind::random:
      return "random";
    case SegmentKind::prefix:
      return "prefix";
    case SegmentKind::suffix:
      return "suffix";
    case SegmentKind::literal:
      return "literal";
  }
  return "?";
}

uint64_t Request::prompt_tokens_count() const {
  if (!segments.empty()) {
    uint64_t sum = 0;
    for (const Segment& s : segments) sum += s.tokens_count;
    return sum;
  }
  return prompt_token_ids.size();
}

void append_token_ids(const Segment& segment, std::vector<uint32_t>& out) {
  RT_ASSERT(segment.vocab_size >= 1, segment.vocab_size);
  size_t before = out.size();
  uint64_t base = mix64(segment.seed);
  for (uint32_t i = 0; i < segment.tokens_count; ++i) {
    out.push_back(static_cast<uint32_t>(mix64(base + i) % segment.vocab_size));
  }
  RT_ASSERT(out.size() == before + segment.tokens_count);
}

std::vector<uint32_t> token_ids(const Request& request) {
  if (request.segments.empty()) return request.prompt_token_ids;
  std::vector<uint32_t> out;
  out.reserve(request.prompt_tokens_count());
  for (const Segment& s : request.segments) append_token_ids(s, out);
  RT_ASSERT(out.size() == request.prompt_tokens_count());
  return out;
}

Result<std::vector<Request>> generate_agentic(const AgenticParams& p) {
  Status valid = check_agentic(p);
  if (!valid) return valid.error();
  std::vector<double> cumulative;
  std::vector<uint32_t> repo_tokens;
  for (uint32_t k = 0; k < p.repos_count; ++k) {
    double weight = 1.0 / std::pow(k + 1.0, p.repo_popularity_zipf_s);
    cumulative.push_back((cumulative.empty() ? 0.0 : cumulative.back()) + weight);
    Rng repo_rng(derive(p.seed, Stream::repo, k));
    repo_tokens.push_back(
        repo_rng.uniform_int(p.repo_context_tokens_min, p.repo_context_tokens_max));
  }
  Segment system{SegmentKind::system, derive(p.seed, Stream::system, 0), p.system_prompt_tokens,
                 p.vocab_size};
  std::vector<double> slot_free_ms(p.sessions_in_flight);
  for (uint32_t j = 0; j < p.sessions_in_flight; ++j)
    slot_free_ms[j] = j * p.session_start_stagger_ms;
  std::vector<Request> out;
  for (uint32_t s = 0; s < p.sessions_count; ++s) {
    Rng rng(derive(p.seed, Stream::session, s));
    SessionPlan plan;
    plan.session = s;
    plan.repo = pick_repo(cumulative, rng);
    uint32_t task = clamp_tokens(rng.lognormal(p.task_tokens_median, p.task_tokens_sigma), 1,
                                 static_cast<uint32_t>(p.task_tokens_median * 20));
    plan.base = {system,
                 {SegmentKind::repo, derive(p.seed, Stream::repo, plan.repo, 1),
                  repo_tokens[plan.repo], p.vocab_size},
                 {SegmentKind::task, derive(p.seed, Stream::task, s), task, p.vocab_size}};
    auto slot = static_cast<size_t>(std::min_element(slot_free_ms.begin(), slot_free_ms.end()) -
                                    slot_free_ms.begin());
    slot_free_ms[slot] = emit_session(p, plan, rng, slot_free_ms[slot], out);
  }
  sort_by_arrival(out);
  RT_ASSERT(!out.empty());
  return out;
}

Result<std::vector<Request>> generate_random(const RandomParams& p) {
  if (p.vocab_size < 2) return bad("vocab_size must be >= 2");
  if (p.requests_count < 1) return bad("requests_count must be >= 1");
  if (p.input_tokens < 1 || p.output_tokens < 1)
    return bad("input_tokens and output_tokens must be >= 1");
  if (!(p.range_ratio >= 0 && p.range_ratio < 1)) return bad("range_ratio must be in [0, 1)");
  if (!(p.request_rate_per_s >= 0)) return bad("request_rate_per_s must be >= 0");
  auto range = [&](uint32_t center, Rng& rng) {
    auto lo = static_cast<uint32_t>(std::max(1.0, std::floor(center * (1 - p.range_ratio))));
    auto hi = static_cast<uint32_t>(std::max<double>(lo, std::floor(center * (1 + p.range_ratio))));
    return rng.uniform_int(lo, hi);
  };
  Rng arrivals(derive(p.seed, Stream::request, UINT64_MAX));
  double arrival_ms = 0;
  std::vector<Request> out;
  for (uint32_t i = 0; i < p.requests_count; ++i) {
    Rng rng(derive(p.seed, Stream::request, i));
    Request request;
    request.session = i;
    if (p.request_rate_per_s > 0 && i > 0)
      arrival_ms += arrivals.exponential(1000.0 / p.request_rate_per_s);
    request.arrival_offset_ms = arrival_ms;
    uint32_t input = range(p.input_tokens, rng);
    request.expected_output_tokens = range(p.output_tokens, rng);
    request.segments = {
        {SegmentKind::random, derive(p.seed, Stream::task, i), input, p.vocab_size}};
    out.push_back(std::move(request));
  }
  RT_ASSERT(out.size() == p.requests_count);
  return out;
}

Result<std::vector<Request>> generate_shared_prefix(const SharedPrefixParams& p) {
  if (p.vocab_size < 2) return bad("vocab_size must be >= 2");
  if (p.groups_count < 1 || p.prompts_per_group < 1) {
    return bad("groups_count and prompts_per_group must be >= 1");
  }
  if (p.output_tokens < 1) return bad("output_tokens must be >= 1");
  if (!(p.request_rate_per_s >= 0)) return bad("request_rate_per_s must be >= 0");
  std::vector<std::pair<uint32_t, uint32_t>> order;  // (group, prompt)
  for (uint32_t g = 0; g < p.groups_count; ++g) {
    for (uint32_t i = 0; i < p.prompts_per_group; ++i) order.emplace_back(g, i);
  }
  Rng rng(derive(p.seed, Stream::group, UINT64_MAX));
  for (size_t i = order.size(); i > 1; --i) {  // Fisher-Yates
    std::swap(order[i - 1], order[rng.uniform_int(0, static_cast<uint32_t>(i - 1))]);
  }
  double arrival_ms = 0;
  std::vector<Request> out;
  for (auto [group, index] : order) {
    Request request;
    request.session = group;
    request.turn = index;
    if (p.request_rate_per_s > 0 && !out.empty())
      arrival_ms += rng.exponential(1000.0 / p.request_rate_per_s);
    request.arrival_offset_ms = arrival_ms;
    request.expected_output_tokens = p.output_tokens;
    request.segments = {
        {SegmentKind::prefix, derive(p.seed, Stream::group, group), p.prefix_tokens, p.vocab_size},
        {SegmentKind::suffix, derive(p.seed, Stream::group, group, index + 1), p.suffix_tokens,
         p.vocab_size}};
    out.push_back(std::move(request));
  }
  RT_ASSERT(out.size() == order.size());
  return out;
}

// ---- JSONL ----

std::string to_jsonl_line(const Request& request) {
  nlohmann::ordered_json line;
  line["session"] = request.session;
  line["turn"] = request.turn;
  if (request.repo >= 0) line["repo"] = request.repo;
  line["arrival_offset_ms"] = request.arrival_offset_ms;
  line["think_time_ms"] = request.think_time_ms;
  line["expected_output_tokens"] = request.expected_output_tokens;
  if (request.segments.empty() && request.prompt_token_ids.empty()) {
    line["prompt"] = request.prompt_text;
  } else {
    line["prompt_token_ids"] = token_ids(request);
  }
  return line.dump();
}

std::string to_jsonl(const std::vector<Request>& requests) {
  std::string out;
  for (const Request& request : requests) {
    out += to_jsonl_line(request);
    out += '\n';
  }
  return out;
}

namespace {

using Json = nlohmann::json;

Error line_error(size_t line_number, const std::string& what) {
  return make_error(ErrorKind::invalid, "line " + std::to_string(line_number) + ": " + what);
}

// Reads an unsigned integer field into out; returns an error text or "".
std::string read_uint(const Json& object, const char* key, bool required, uint64_t max,
                      uint64_t& out) {
  auto it = object.find(key);
  if (it == object.end()) return required ? std::string("missing \"") + key + "\"" : "";
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
    return std::string("\"") + key + "\" must be a non-negative integer";
  }
  out = it->get<uint64_t>();
  if (out > max) return std::string("\"") + key + "\" is above " + std::to_string(max);
  return "";
}

std::string read_ms(const Json& object, const char* key, bool required, double& out) {
  auto it = object.find(key);
  if (it == object.end()) return required ? std::string("missing \"") + key + "\"" : "";
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0) {
    return std::string("\"") + key + "\" must be a finite number >= 0";
  }
  out = it->get<double>();
  return "";
}

std::string read_prompt(const Json& object, Request& request) {
  auto ids = object.find("prompt_token_ids");
  auto text = object.find("prompt");
  if ((ids == object.end()) == (text == object.end())) {
    return "exactly one of \"prompt_token_ids\" and \"prompt\" is required";
  }
  if (text != object.end()) {
    if (!text->is_string()) return "\"prompt\" must be a string";
    request.prompt_text = text->get<std::string>();
    return "";
  }
  if (!ids->is_array()) return "\"prompt_token_ids\" must be an array";
  request.prompt_token_ids.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const Json& id = (*ids)[i];
    if (!id.is_number_unsigned() || id.get<uint64_t>() > UINT32_MAX) {
      return "\"prompt_token_ids\"[" + std::to_string(i) + "] must be an integer in 0.." +
             std::to_string(UINT32_MAX);
    }
    request.prompt_token_ids.push_back(id.get<uint32_t>());
  }
  return "";
}

}  // namespace

Result<Request> parse_jsonl_line(std::string_view line, size_t line_number) {
  Json object = Json::parse(line.begin(), line.end(), nullptr, false);
  if (object.is_discarded()) return line_error(line_number, "not valid JSON");
  if (!object.is_object()) return line_error(line_number, "not a JSON object");
  Request request;
  uint64_t session = 0, turn = 0, output = 0;
  std::string problem = read_uint(object, "session", true, UINT32_MAX, session);
  if (problem.empty()) problem = read_uint(object, "turn", true, UINT32_MAX, turn);
  if (problem.empty())
    problem = read_uint(object, "expected_output_tokens", true, UINT32_MAX, output);
  if (problem.empty())
    problem = read_ms(object, "arrival_offset_ms", true, request.arrival_offset_ms);
  if (problem.empty()) problem = read_ms(object, "think_time_ms", false, request.think_time_ms);
  if (problem.empty() && object.contains("repo")) {
    uint64_t repo = 0;
    problem = read_uint(object, "repo", false, INT32_MAX, repo);
    request.repo = static_cast<int32_t>(repo);
  }
  if (problem.empty()) problem = read_prompt(object, request);
  if (!problem.empty()) return line_error(line_number, problem);
  request.session = static_cast<uint32_t>(session);
  request.turn = static_cast<uint32_t>(turn);
  request.expected_output_tokens = static_cast<uint32_t>(output);
  RT_ASSERT(request.segments.empty());
  return request;
}

Result<std::vector<Request>> read_jsonl(std::string_view text) {
  std::vector<Request> out;
  size_t line_number = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    ++line_number;
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    Result<Request> request = parse_jsonl_line(line, line_number);
    if (!request.ok()) return request.error();
    out.push_back(std::move(request).value());
  }
  RT_ASSERT(start >= text.size());
  return out;
}

}  // namespace tandem::workload
