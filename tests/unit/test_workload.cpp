#include <doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tools/workload/workload.hpp"

using tandem::ErrorKind;
using namespace tandem::workload;

namespace {

AgenticParams small_params(uint64_t seed = 7) {
  AgenticParams p;
  p.seed = seed;
  p.sessions_count = 10;
  p.sessions_in_flight = 3;
  p.system_prompt_tokens = 64;
  p.repos_count = 3;
  p.repo_context_tokens_min = 100;
  p.repo_context_tokens_max = 300;
  p.task_tokens_median = 20;
  p.tool_output_tokens_median = 30;
  p.tool_output_tokens_max = 200;
  p.output_tokens_min = 5;
  p.output_tokens_max = 10;
  p.turns_min = 3;
  p.turns_max = 6;
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

size_t common_prefix(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

}  // namespace

TEST_CASE("workload: same seed, same trace; another seed, another trace") {
  auto a = generate_agentic(small_params(7));
  auto b = generate_agentic(small_params(7));
  auto c = generate_agentic(small_params(8));
  REQUIRE(a.ok());
  REQUIRE(c.ok());
  CHECK(to_jsonl(*a) == to_jsonl(*b));
  CHECK(to_jsonl(*a) != to_jsonl(*c));
  for (size_t i = 1; i < a->size(); ++i) {
    CHECK((*a)[i - 1].arrival_offset_ms <= (*a)[i].arrival_offset_ms);
  }
  RandomParams r;
  r.requests_count = 20;
  CHECK(to_jsonl(*generate_random(r)) == to_jsonl(*generate_random(r)));
  SharedPrefixParams sp;
  sp.prefix_tokens = 50;
  sp.suffix_tokens = 5;
  CHECK(to_jsonl(*generate_shared_prefix(sp)) == to_jsonl(*generate_shared_prefix(sp)));
}

TEST_CASE("workload: agentic distributions land on their parameters") {
  AgenticParams p;  // issue 5 defaults
  p.sessions_count = 400;
  p.context_tokens_max = 100000000;  // no truncation: measure the raw distributions
  auto trace = generate_agentic(p);
  REQUIRE(trace.ok());
  std::map<uint32_t, uint32_t> turns;
  std::map<uint32_t, std::pair<double, double>> span_ms;  // session -> first, last arrival
  std::vector<double> tool, output, think, task;
  std::map<uint32_t, uint32_t> repo_tokens;
  for (const Request& r : *trace) {
    turns[r.session] = std::max(turns[r.session], r.turn + 1);
    auto [it, fresh] = span_ms.try_emplace(r.session, r.arrival_offset_ms, r.arrival_offset_ms);
    it->second.second = std::max(it->second.second, r.arrival_offset_ms);
    output.push_back(r.expected_output_tokens);
    REQUIRE(r.segments.size() >= 3);
    CHECK(r.segments[0].kind == SegmentKind::system);
    CHECK(r.segments[0].tokens_count == 8192);
    const Segment& repo = r.segments[1];
    CHECK(repo.tokens_count >= 5000);
    CHECK(repo.tokens_count <= 40000);
    auto [known, inserted] =
        repo_tokens.try_emplace(static_cast<uint32_t>(r.repo), repo.tokens_count);
    CHECK(known->second == repo.tokens_count);  // a repository's context never changes
    if (r.turn == 0) {
      task.push_back(r.segments[2].tokens_count);
    } else {
      CHECK(r.segments.back().kind == SegmentKind::tool);
      tool.push_back(r.segments.back().tokens_count);
      think.push_back(r.think_time_ms);
    }
  }
  REQUIRE(turns.size() == 400);
  std::vector<double> turn_counts;
  for (auto [session, count] : turns) turn_counts.push_back(count);
  CHECK(mean(turn_counts) == doctest::Approx(50).epsilon(0.06));
  CHECK(*std::min_element(turn_counts.begin(), turn_counts.end()) >= 20);
  CHECK(*std::max_element(turn_counts.begin(), turn_counts.end()) <= 80);
  CHECK(mean(output) == doctest::Approx(450).epsilon(0.02));
  CHECK(median(tool) == doctest::Approx(800).epsilon(0.05));
  CHECK(mean(tool) == doctest::Approx(800 * std::exp(0.5)).epsilon(0.06));  // long tail
  CHECK(median(think) == doctest::Approx(1000).epsilon(0.05));
  CHECK(median(task) == doctest::Approx(300).epsilon(0.1));
  // Never more than N sessions in flight, and N are reached.
  std::vector<std::pair<double, int>> events;
  for (auto [session, span] : span_ms) {
    events.emplace_back(span.first, +1);
    events.emplace_back(span.second, -1);
  }
  std::sort(events.begin(), events.end(), [](auto a, auto b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;
  });
  int live = 0, live_max = 0;
  for (auto [t, delta] : events) live_max = std::max(live_max, live += delta);
  CHECK(live_max == 8);
}

TEST_CASE("workload: repository popularity follows the Zipf skew") {
  AgenticParams p;
  p.sessions_count = 20000;
  p.turns_min = p.turns_max = 1;
  auto trace = generate_agentic(p);
  REQUIRE(trace.ok());
  std::vector<double> share(12, 0.0);
  for (const Request& r : *trace) share[static_cast<size_t>(r.repo)] += 1.0 / 20000;
  double harmonic = 0;
  for (int k = 1; k <= 12; ++k) harmonic += 1.0 / k;
  for (size_t k = 0; k < 12; ++k) {
    CHECK(share[k] == doctest::Approx(1.0 / (static_cast<double>(k + 1) * harmonic)).epsilon(0.12));
  }
}

TEST_CASE("workload: prefixes are shared exactly as specified") {
  AgenticParams p = small_params();
  p.vocab_size = 200064;
  p.sessions_count = 12;
  auto trace = generate_agentic(p);
  REQUIRE(trace.ok());
  std::map<uint32_t, std::vector<const Request*>> by_session;
  for (const Request& r : *trace) by_session[r.session].push_back(&r);
  std::map<uint32_t, std::vector<uint32_t>> first_prompt;  // session -> turn 0 ids
  std::map<uint32_t, uint32_t> repo_of, repo_tokens;
  for (auto& [session, requests] : by_session) {
    std::sort(requests.begin(), requests.end(),
              [](const Request* a, const Request* b) { return a->turn < b->turn; });
    std::vector<uint32_t> previous;
    for (const Request* r : requests) {
      auto ids = token_ids(*r);
      CHECK(ids.size() == r->prompt_tokens_count());
      if (r->turn > 0) {  // history + previous answer + new tool output
        CHECK(common_prefix(previous, ids) == previous.size());
        CHECK(ids.size() == previous.size() + requests[r->turn - 1]->expected_output_tokens +
                                r->segments.back().tokens_count);
      }
      previous = std::move(ids);
    }
    first_prompt[session] = token_ids(*requests[0]);
    repo_of[session] = static_cast<uint32_t>(requests[0]->repo);
    repo_tokens[session] = requests[0]->segments[1].tokens_count;
  }
  int same_repo_pairs = 0, other_repo_pairs = 0;
  for (auto& [a, ids_a] : first_prompt) {
    for (auto& [b, ids_b] : first_prompt) {
      if (a >= b) continue;
      size_t shared = common_prefix(ids_a, ids_b);
      if (repo_of[a] == repo_of[b]) {
        CHECK(shared == 64 + repo_tokens[a]);  // system + repository, then the task differs
        ++same_repo_pairs;
      } else {
        CHECK(shared == 64);  // the system prompt only
        ++other_repo_pairs;
      }
    }
  }
  CHECK(same_repo_pairs > 0);
  CHECK(other_repo_pairs > 0);
  for (uint32_t id : first_prompt.begin()->second) CHECK(id < 200064);
}

TEST_CASE("workload: random and shared-prefix shapes") {
  RandomParams r;
  r.requests_count = 2000;
  r.input_tokens = 100;
  r.range_ratio = 0.5;
  r.request_rate_per_s = 50;
  auto random = generate_random(r);
  REQUIRE(random.ok());
  std::vector<double> inputs;
  for (const Request& q : *random) {
    inputs.push_back(static_cast<double>(q.prompt_tokens_count()));
    CHECK(q.prompt_tokens_count() >= 50);
    CHECK(q.prompt_tokens_count() <= 150);
  }
  CHECK(mean(inputs) == doctest::Approx(100).epsilon(0.03));
  double mean_gap_ms = random->back().arrival_offset_ms / 1999;
  CHECK(mean_gap_ms == doctest::Approx(20).epsilon(0.08));  // Poisson at 50/s
  SharedPrefixParams sp;
  sp.groups_count = 3;
  sp.prompts_per_group = 4;
  sp.prefix_tokens = 40;
  sp.suffix_tokens = 10;
  auto shared = generate_shared_prefix(sp);
  REQUIRE(shared.ok());
  REQUIRE(shared->size() == 12);
  for (const Request& a : *shared) {
    for (const Request& b : *shared) {
      if (&a == &b) continue;
      size_t common = common_prefix(token_ids(a), token_ids(b));
      CHECK(common == (a.session == b.session ? 40u : 0u));
    }
  }
}

TEST_CASE("workload: JSONL round trip") {
  auto trace = generate_agentic(small_params());
  REQUIRE(trace.ok());
  std::string text = to_jsonl(*trace);
  auto read = read_jsonl(text);
  REQUIRE(read.ok());
  REQUIRE(read->size() == trace->size());
  for (size_t i = 0; i < trace->size(); ++i) {
    const Request& a = (*trace)[i];
    const Request& b = (*read)[i];
    CHECK(a.session == b.session);
    CHECK(a.turn == b.turn);
    CHECK(a.repo == b.repo);
    CHECK(a.arrival_offset_ms == b.arrival_offset_ms);
    CHECK(a.think_time_ms == b.think_time_ms);
    CHECK(a.expected_output_tokens == b.expected_output_tokens);
    CHECK(token_ids(a) == token_ids(b));
  }
  CHECK(to_jsonl(*read) == text);
  auto texts = read_jsonl(
      "{\"session\":1,\"turn\":2,\"arrival_offset_ms\":3.5,\"expected_output_tokens\":9,"
      "\"prompt\":\"fix the bug\",\"extra\":true}\n\n");
  REQUIRE(texts.ok());
  REQUIRE(texts->size() == 1);
  CHECK((*texts)[0].prompt_text == "fix the bug");
  CHECK((*texts)[0].repo == -1);
  CHECK(read_jsonl(to_jsonl(*texts))->front().prompt_text == "fix the bug");
}

TEST_CASE("workload: a malformed JSONL line is an error naming its line") {
  std::string good =
      "{\"session\":0,\"turn\":0,\"arrival_offset_ms\":0,\"expected_output_tokens\":4,"
      "\"prompt_token_ids\":[1,2,3]}";
  auto expect = [&](const std::string& bad_line, const std::string& message) {
    auto read = read_jsonl(good + "\n\n" + bad_line + "\n" + good + "\n");
    REQUIRE_FALSE(read.ok());
    CHECK(read.error().kind == ErrorKind::invalid);
    CHECK_MESSAGE(read.error().message == message, read.error().message);
  };
  expect("{\"session\":0,", "line 3: not valid JSON");
  expect("[1,2]", "line 3: not a JSON object");
  expect("{\"session\":0,\"arrival_offset_ms\":0,\"expected_output_tokens\":4,\"prompt\":\"x\"}",
         "line 3: missing \"turn\"");
  expect(
      "{\"session\":-1,\"turn\":0,\"arrival_offset_ms\":0,\"expected_output_tokens\":4,"
      "\"prompt\":\"x\"}",
      "line 3: \"session\" must be a non-negative integer");
  expect(
      "{\"session\":0,\"turn\":0,\"arrival_offset_ms\":-5,\"expected_output_tokens\":4,"
      "\"prompt\":\"x\"}",
      "line 3: \"arrival_offset_ms\" must be a finite number >= 0");
  expect(
      "{\"session\":0,\"turn\":0,\"arrival_offset_ms\":0,\"expected_output_tokens\":4,"
      "\"prompt_token_ids\":[1,\"a\"]}",
      "line 3: \"prompt_token_ids\"[1] must be an integer in 0..4294967295");
  expect(
      "{\"session\":0,\"turn\":0,\"arrival_offset_ms\":0,\"expected_output_tokens\":4,"
      "\"prompt_token_ids\":[1],\"prompt\":\"x\"}",
      "line 3: exactly one of \"prompt_token_ids\" and \"prompt\" is required");
}

TEST_CASE("workload: bad parameters are errors naming the field") {
  AgenticParams p;
  p.turns_min = 90;
  CHECK(generate_agentic(p).error().message.find("turns_min") != std::string::npos);
  p = AgenticParams{};
  p.context_tokens_max = 30000;
  CHECK(generate_agentic(p).error().message.find("context_tokens_max") != std::string::npos);
  RandomParams r;
  r.range_ratio = 1.5;
  CHECK(generate_random(r).error().message.find("range_ratio") != std::string::npos);
  SharedPrefixParams s;
  s.groups_count = 0;
  CHECK(generate_shared_prefix(s).error().kind == ErrorKind::invalid);
}
