#include "actors/decode/suffix_tree.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/base/assert.hpp"

namespace tandem::decode {

Status SuffixConfig::validate() const {
  auto bad = [](const char* key, const std::string& value, const char* rule) {
    return make_error(ErrorKind::invalid,
                      std::string("suffix: ") + key + " = " + value + " " + rule);
  };
  if (depth_max < 1 || depth_max > 256) {
    return bad("depth_max", std::to_string(depth_max), "is outside 1..256");
  }
  if (!(probability_min > 0 && probability_min <= 1)) {
    return bad("probability_min", std::to_string(probability_min), "is outside (0, 1]");
  }
  if (!(match_factor > 0) || !std::isfinite(match_factor)) {
    return bad("match_factor", std::to_string(match_factor), "is not above 0");
  }
  if (request_nodes_max < 1) return bad("request_nodes_max", "0", "is below 1");
  if (cache_nodes_max < 1) return bad("cache_nodes_max", "0", "is below 1");
  if (cache_tokens_max < 1) return bad("cache_tokens_max", "0", "is below 1");
  return {};
}

SuffixTree::SuffixTree(uint32_t depth_max, uint32_t nodes_max)
    : depth_max_(depth_max), nodes_max_(nodes_max) {
  RT_ASSERT(depth_max_ >= 1 && depth_max_ <= 256, depth_max_);
  nodes_.emplace_back();  // the root
}

uint32_t SuffixTree::child(uint32_t parent, int32_t token) const {
  auto it = edges_.find(edge_key(parent, token));
  return it == edges_.end() ? 0 : it->second;
}

uint32_t SuffixTree::child_or_new(uint32_t parent, int32_t token) {
  if (uint32_t c = child(parent, token)) return c;
  if (nodes_count() >= size_t{nodes_max_} + 1) {  // the root is not counted against the bound
    ++nodes_refused_;
    return 0;
  }
  uint32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
    nodes_[id] = Node{};
  } else {
    id = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[id];
  n.token = token;
  n.parent = parent;
  n.depth = static_cast<uint16_t>(nodes_[parent].depth + 1);
  n.next_sibling = nodes_[parent].first_child;
  nodes_[parent].first_child = id;
  edges_.emplace(edge_key(parent, token), id);
  return id;
}

void SuffixTree::add(uint32_t node, int64_t delta) {
  Node& n = nodes_[node];
  RT_ASSERT(node != 0 && static_cast<int64_t>(n.count) + delta >= 0, node, n.count, delta);
  n.count = static_cast<uint32_t>(static_cast<int64_t>(n.count) + delta);
  Node& p = nodes_[n.parent];
  p.followers = static_cast<uint32_t>(static_cast<int64_t>(p.followers) + delta);
  if (delta > 0) {
    if (p.best_child == 0 || nodes_[p.best_child].count < n.count) p.best_child = node;
  } else if (p.best_child == node) {
    rebest(n.parent);
  }
}

void SuffixTree::rebest(uint32_t node) {
  uint32_t best = 0;
  for (uint32_t c = nodes_[node].first_child; c != 0; c = nodes_[c].next_sibling) {
    if (nodes_[c].count > 0 && (best == 0 || nodes_[c].count > nodes_[best].count)) best = c;
  }
  nodes_[node].best_child = best;
}

void SuffixTree::unlink(uint32_t node) {
  Node& n = nodes_[node];
  RT_ASSERT(n.count == 0 && n.first_child == 0, node, n.count);
  Node& p = nodes_[n.parent];
  if (p.first_child == node) {
    p.first_child = n.next_sibling;
  } else {
    uint32_t c = p.first_child;
    while (nodes_[c].next_sibling != node) c = nodes_[c].next_sibling;
    nodes_[c].next_sibling = n.next_sibling;
  }
  if (p.best_child == node) rebest(n.parent);
  edges_.erase(edge_key(n.parent, n.token));
  free_.push_back(node);
}

void SuffixTree::append(Cursor& cursor, int32_t token) {
  // The suffixes ending here: one longer than each before (up to depth_max), and the token.
  std::vector<uint32_t> next;
  next.reserve(std::min<size_t>(cursor.active.size() + 1, depth_max_));
  auto extend = [&](uint32_t from) {
    uint32_t c = child_or_new(from, token);
    if (c == 0) return false;
    add(c, +1);
    next.push_back(c);
    return true;
  };
  if (extend(0)) {
    for (uint32_t a : cursor.active) {
      if (nodes_[a].depth >= depth_max_ || !extend(a)) break;
    }
  }
  cursor.active = std::move(next);
}

void SuffixTree::insert(std::span<const int32_t> tokens) {
  ++generation_;
  Cursor cursor;
  for (int32_t t : tokens) append(cursor, t);
}

void SuffixTree::remove(std::span<const int32_t> tokens) {
  ++generation_;
  for (size_t s = 0; s < tokens.size(); ++s) {
    // The path of tokens[s, s + depth): decrement each node, deepest first (a node is freed
    // only once its children are).
    std::vector<uint32_t> path;
    uint32_t at = 0;
    for (size_t i = s; i < tokens.size() && path.size() < depth_max_; ++i) {
      at = child(at, tokens[i]);
      RT_ASSERT(at != 0, "removing what was not inserted", s, i);
      path.push_back(at);
    }
    for (size_t j = path.size(); j-- > 0;) {
      add(path[j], -1);
      if (nodes_[path[j]].count == 0) unlink(path[j]);
    }
  }
}

uint32_t SuffixTree::find(std::span<const int32_t> path) const {
  uint32_t at = 0;
  for (int32_t t : path) {
    at = child(at, t);
    if (at == 0) return 0;
  }
  return at;
}

uint32_t SuffixTree::count(std::span<const int32_t> substring) const {
  if (substring.empty() || substring.size() > depth_max_) return 0;
  uint32_t at = find(substring);
  return at == 0 ? 0 : nodes_[at].count;
}

SuffixDraft SuffixTree::extend(uint32_t node, uint32_t match_tokens, uint32_t draft_tokens,
                               double probability_min) const {
  SuffixDraft d;
  d.match_tokens = match_tokens;
  double probability = 1.0;
  uint32_t at = node;
  while (d.tokens.size() < draft_tokens && nodes_[at].followers > 0 && nodes_[at].best_child) {
    const Node& c = nodes_[nodes_[at].best_child];
    probability *= static_cast<double>(c.count) / nodes_[at].followers;
    if (probability < probability_min) break;
    d.tokens.push_back(c.token);
    d.score += probability;
    at = nodes_[at].best_child;
  }
  return d;
}

SuffixDraft SuffixTree::propose(std::span<const int32_t> context, uint32_t draft_tokens,
                                double probability_min, double match_factor) const {
  Cursor at;
  locate(context, at);
  return propose_at(at.active, draft_tokens, probability_min, match_factor);
}

void SuffixTree::locate(std::span<const int32_t> context, Cursor& out) const {
  out.active.clear();
  const size_t longest = std::min<size_t>(context.size(), depth_max_);
  for (size_t m = 1; m <= longest; ++m) {
    uint32_t node = find(context.subspan(context.size() - m));
    if (node == 0) break;  // no longer suffix can be there either
    out.active.push_back(node);
  }
}

void SuffixTree::advance(const Cursor& before, int32_t token, Cursor& after) const {
  after.active.clear();
  uint32_t first = child(0, token);
  if (first == 0) return;
  after.active.push_back(first);
  for (uint32_t a : before.active) {
    if (nodes_[a].depth >= depth_max_) break;
    uint32_t c = child(a, token);
    if (c == 0) break;  // every substring's suffixes are recorded: none longer either
    after.active.push_back(c);
  }
}

SuffixDraft SuffixTree::propose_at(std::span<const uint32_t> suffix_nodes, uint32_t draft_tokens,
                                   double probability_min, double match_factor) const {
  SuffixDraft best;
  for (size_t m = 1; m <= suffix_nodes.size(); ++m) {
    const uint32_t node = suffix_nodes[m - 1];
    const auto budget = static_cast<uint32_t>(
        std::min<double>(draft_tokens, std::floor(match_factor * static_cast<double>(m))));
    SuffixDraft d = extend(node, static_cast<uint32_t>(m), budget, probability_min);
    if (!d.tokens.empty() && d.score >= best.score) best = std::move(d);  // ties: longer m
  }
  return best;
}

void SuffixTree::check_invariants() const {
  size_t live = 0;
  for (uint32_t id = 0; id < nodes_.size(); ++id) {
    if (std::find(free_.begin(), free_.end(), id) != free_.end()) continue;
    ++live;
    const Node& n = nodes_[id];
    uint64_t followers = 0;
    uint32_t most = 0;
    for (uint32_t c = n.first_child; c != 0; c = nodes_[c].next_sibling) {
      RT_ASSERT(nodes_[c].parent == id && nodes_[c].depth == n.depth + 1, id, c);
      RT_ASSERT(child(id, nodes_[c].token) == c, id, c);
      RT_ASSERT(nodes_[c].count > 0, c);
      followers += nodes_[c].count;
      most = std::max(most, nodes_[c].count);
    }
    RT_ASSERT(followers == n.followers, id, followers, n.followers);
    RT_ASSERT((n.best_child == 0) == (most == 0), id, n.best_child);
    if (n.best_child) RT_ASSERT(nodes_[n.best_child].count == most, id, most);
    if (id != 0) RT_ASSERT(n.count >= n.followers && n.depth <= depth_max_, id, n.count);
  }
  RT_ASSERT(live == nodes_count() && edges_.size() + 1 == live, live, edges_.size());
  RT_ASSERT(nodes_count() <= size_t{nodes_max_} + 1, nodes_count(), nodes_max_);
}

SuffixCache::SuffixCache(const SuffixConfig& config)
    : tokens_max_(config.cache_tokens_max),
      nodes_max_(config.cache_nodes_max),
      tree_(config.depth_max, UINT32_MAX - 1) {
  RT_ASSERT(config.validate().ok(), config.validate().error().describe());
}

void SuffixCache::add(std::vector<int32_t> output) {
  if (output.empty()) return;
  tree_.insert(output);
  tokens_ += output.size();
  outputs_.push_back(std::move(output));
  while ((tokens_ > tokens_max_ || tree_.nodes_count() > nodes_max_) && outputs_.size() > 1) {
    tree_.remove(outputs_.front());
    tokens_ -= outputs_.front().size();
    outputs_.pop_front();
  }
}

SuffixProposer::SuffixProposer(const SuffixConfig& config, const SuffixCache* cache)
    : config_(config), cache_(cache), tree_(config.depth_max, config.request_nodes_max) {
  RT_ASSERT(config_.validate().ok(), config_.validate().error().describe());
}

void SuffixProposer::append(int32_t token) {
  context_.push_back(token);
  tree_.append(cursor_, token);
  if (cache_ != nullptr && cache_generation_ == cache_->tree().generation()) {
    cache_->tree().advance(cache_cursor_, token, cache_scratch_);
    std::swap(cache_cursor_, cache_scratch_);
  }
}

void SuffixProposer::append(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) append(t);
}

SuffixDraft SuffixProposer::propose(uint32_t draft_tokens) const {
  if (draft_tokens == 0) return {};
  // The own tree's nodes of the context's suffixes are its cursor's (append keeps them).
  SuffixDraft own = tree_.propose_at(cursor_.active, draft_tokens, config_.probability_min,
                                     config_.match_factor);
  if (cache_ == nullptr) return own;
  const SuffixTree& cache = cache_->tree();
  if (cache_generation_ != cache.generation()) {
    cache.locate(context_, cache_cursor_);
    cache_generation_ = cache.generation();
  }
  SuffixDraft shared = cache.propose_at(cache_cursor_.active, draft_tokens,
                                        config_.probability_min, config_.match_factor);
  // Ties: the request's own tree.
  return shared.score > own.score ? shared : own;
}

}  // namespace tandem::decode
