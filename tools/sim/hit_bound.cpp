#include "tools/sim/hit_bound.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "runtime/base/assert.hpp"
#include "runtime/base/mix.hpp"

namespace tandem::sim {
namespace {

// A prompt's chain so far: the last full block's hash and the open block's tokens.
struct ChainState {
  uint64_t last_hash = 0;
  uint64_t blocks_count = 0;
  std::vector<uint32_t> tail;
  size_t segments_count = 0;  // leading segments absorbed
  uint32_t request_index = 0; // the request whose segments these are
};

class Bound {
 public:
  Bound(const std::vector<workload::Request>& requests, uint32_t block_tokens)
      : requests_(requests), block_tokens_(block_tokens) {}

  void add(uint32_t request_index);
  HitBound result() const { return result_; }

 private:
  // Absorbs tokens into `chain`, recording new blocks in seen_ and extending the leading
  // run of seen blocks while it lasts.
  void absorb(ChainState& chain, std::span<const uint32_t> tokens);
  void absorb_segments(ChainState& chain, const workload::Request& r, size_t from);
  ChainState& start_chain(const workload::Request& r);

  const std::vector<workload::Request>& requests_;
  uint32_t block_tokens_;
  std::unordered_set<uint64_t> seen_;
  std::unordered_map<uint32_t, ChainState> sessions_;
  std::map<std::pair<uint64_t, uint64_t>, ChainState> bases_;  // (system, repo) chains
  uint64_t leading_blocks_ = 0;  // of the request being added
  bool leading_ = true;
  std::vector<uint32_t> scratch_;
  HitBound result_;
};

void Bound::absorb(ChainState& chain, std::span<const uint32_t> tokens) {
  for (uint32_t token : tokens) {
    chain.tail.push_back(token);
    if (chain.tail.size() < block_tokens_) continue;
    uint64_t h = mix64(chain.last_hash ^ 0x5bd1e995u);
    for (uint32_t t : chain.tail) h = mix64(h ^ t);
    chain.tail.clear();
    chain.last_hash = h;
    chain.blocks_count += 1;
    bool first_seen = seen_.insert(h).second;
    if (first_seen) leading_ = false;
    if (leading_) leading_blocks_ += 1;
  }
  RT_ASSERT(chain.tail.size() < block_tokens_, chain.tail.size());
}

void Bound::absorb_segments(ChainState& chain, const workload::Request& r, size_t from) {
  for (size_t k = from; k < r.segments.size(); ++k) {
    scratch_.clear();
    workload::append_token_ids(r.segments[k], scratch_);
    absorb(chain, scratch_);
  }
  chain.segments_count = r.segments.size();
}

// A fresh chain for `r`, starting from its memoized system + repository chain if it has one.
ChainState& Bound::start_chain(const workload::Request& r) {
  ChainState& chain = sessions_[r.session];
  chain = ChainState{};
  const auto& seg = r.segments;
  if (seg.size() < 2 || seg[0].kind != workload::SegmentKind::system ||
      seg[1].kind != workload::SegmentKind::repo) {
    return chain;
  }
  auto key = std::make_pair(seg[0].seed ^ (uint64_t{seg[0].tokens_count} << 32),
                            seg[1].seed ^ (uint64_t{seg[1].tokens_count} << 32));
  auto it = bases_.find(key);
  if (it == bases_.end()) {
    ChainState base;
    for (size_t k = 0; k < 2; ++k) {
      scratch_.clear();
      workload::append_token_ids(seg[k], scratch_);
      absorb(base, scratch_);
    }
    base.segments_count = 2;
    it = bases_.emplace(key, std::move(base)).first;
  } else {
    leading_blocks_ = it->second.blocks_count;  // every block of it was seen (and recorded)
  }
  chain = it->second;
  return chain;
}

void Bound::add(uint32_t request_index) {
  const workload::Request& r = requests_[request_index];
  leading_blocks_ = 0;
  leading_ = true;
  uint64_t tokens = 0;
  if (!r.prompt_token_ids.empty()) {
    ChainState chain;
    absorb(chain, r.prompt_token_ids);
    tokens = r.prompt_token_ids.size();
  } else {
    auto it = sessions_.find(r.session);
    bool extends = it != sessions_.end() &&
                   requests_[it->second.request_index].segments.size() ==
                       it->second.segments_count &&
                   it->second.segments_count <= r.segments.size() &&
                   std::equal(r.segments.begin(),
                              r.segments.begin() +
                                  static_cast<std::ptrdiff_t>(it->second.segments_count),
                              requests_[it->second.request_index].segments.begin());
    ChainState* chain = nullptr;
    if (extends) {
      chain = &it->second;
      leading_blocks_ = chain->blocks_count;  // the session's previous turn had them all
    } else {
      chain = &start_chain(r);
    }
    absorb_segments(*chain, r, chain->segments_count);
    chain->request_index = request_index;
    tokens = r.prompt_tokens_count();
    RT_ASSERT(chain->blocks_count == tokens / block_tokens_, chain->blocks_count, tokens);
  }
  uint64_t reusable = leading_blocks_ * block_tokens_;
  if (reusable >= tokens) reusable = tokens >= block_tokens_ ? tokens - block_tokens_ : 0;
  RT_ASSERT(reusable <= tokens, reusable, tokens);
  result_.requests_count += 1;
  result_.prompt_tokens_count += tokens;
  result_.reusable_tokens_count += reusable;
  if (r.turn == 0) {
    result_.first_turn_tokens_count += tokens;
    result_.first_turn_reusable_count += reusable;
  }
}

}  // namespace

HitBound prefix_hit_bound(const std::vector<workload::Request>& requests,
                          std::span<const uint32_t> order, uint32_t block_tokens) {
  RT_ASSERT(block_tokens >= 1, block_tokens);
  Bound bound(requests, block_tokens);
  for (uint32_t index : order) {
    RT_ASSERT(index < requests.size(), index, requests.size());
    bound.add(index);
  }
  HitBound out = bound.result();
  out.hit_rate_max = out.prompt_tokens_count == 0
                         ? 0.0
                         : static_cast<double>(out.reusable_tokens_count) /
                               static_cast<double>(out.prompt_tokens_count);
  return out;
}

}  // namespace tandem::sim
