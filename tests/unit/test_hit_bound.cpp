// The trace's prefix hit-rate ceiling (tools/sim/hit_bound): exact counts on a tiny trace.
#include <doctest.h>

#include <vector>

#include "tools/sim/hit_bound.hpp"

using tandem::workload::Request;
using tandem::workload::Segment;
using tandem::workload::SegmentKind;

namespace {

Segment seg(SegmentKind kind, uint64_t seed, uint32_t tokens) {
  return Segment{kind, seed, tokens, 1000};
}

Request request(uint32_t session, uint32_t turn, std::vector<Segment> segments) {
  Request r;
  r.session = session;
  r.turn = turn;
  r.segments = std::move(segments);
  return r;
}

}  // namespace

TEST_CASE("hit bound: leading blocks seen before are reusable, the rest is computed once") {
  Segment system = seg(SegmentKind::system, 1, 32);  // blocks of 16: 2 blocks
  Segment repo = seg(SegmentKind::repo, 2, 64);      // 4 blocks
  Segment task_a = seg(SegmentKind::task, 3, 20);
  std::vector<Request> requests{
      request(0, 0, {system, repo, task_a}),                          // 116 tokens, cold
      request(1, 0, {system, repo, seg(SegmentKind::task, 4, 20)}),  // shares 6 blocks
      request(0, 1, {system, repo, task_a, seg(SegmentKind::assistant, 5, 30),
                     seg(SegmentKind::tool, 6, 10)}),                // extends turn 0
      request(2, 0, {system, repo, task_a}),                          // a repeat of turn 0
      request(3, 0, {system, repo}),  // 96 tokens, all seen: still recomputes its last block
  };
  std::vector<uint32_t> order{0, 1, 2, 3, 4};
  auto b = tandem::sim::prefix_hit_bound(requests, order, 16);
  CHECK(b.requests_count == 5);
  CHECK(b.prompt_tokens_count == 116 + 116 + 156 + 116 + 96);
  // 0 + 6 blocks + 7 blocks (turn 0's full blocks) + 7 blocks + (6 - 1) blocks.
  CHECK(b.reusable_tokens_count == 0 + 96 + 112 + 112 + 80);
  CHECK(b.first_turn_tokens_count == 116 + 116 + 116 + 96);
  CHECK(b.first_turn_reusable_count == 0 + 96 + 112 + 80);
  CHECK(b.hit_rate_max == doctest::Approx(400.0 / 600.0));
  // Order matters only through what was seen first: the repeat first, turn 0 second.
  std::vector<uint32_t> swapped{3, 0};
  auto s = tandem::sim::prefix_hit_bound(requests, swapped, 16);
  CHECK(s.reusable_tokens_count == 112);
  // Token-id prompts (traces) are hashed whole.
  Request ids;
  ids.prompt_token_ids.assign(40, 7);
  std::vector<Request> trace{ids, ids};
  std::vector<uint32_t> both{0, 1};
  auto t = tandem::sim::prefix_hit_bound(trace, both, 16);
  CHECK(t.prompt_tokens_count == 80);
  CHECK(t.reusable_tokens_count == 32);
  std::vector<uint32_t> none;
  CHECK(tandem::sim::prefix_hit_bound(trace, none, 16).hit_rate_max == 0.0);
}
