// tandem/actors/decode: suffix decoding's proposer (issue 14; SuffixDecoding, arXiv
// 2411.04975, as ArcticInference serves it). Pure: no threads, clocks or I/O.
//
// SuffixTree is a trie of every substring of at most depth_max tokens of what was inserted,
// each node counting the substring's occurrences (a depth-bounded suffix tree). A request
// keeps one over its own context (prompt, then each generated token, appended one at a time:
// O(depth_max) per token), and the decode instance one over recent requests' outputs
// (SuffixCache: bounded in tokens, the oldest output out first).
//
// A proposal, for each match length m = 1..depth_max where the context's last m tokens are a
// node with followers: from that node, follow the most frequent child while the path's
// probability (the product of child count / followers) stays at or above probability_min, at
// most min(draft_tokens, match_factor x m) tokens; its score is the sum of the path's
// probabilities (the expected accepted tokens). The best score over both trees wins (ties:
// the longer match, then the request's own tree).
//
// Bounds: a request's tree holds at most request_nodes_max nodes; past it, substrings that
// would need new nodes are not recorded (counted in nodes_refused), so a long prompt degrades
// the tree, never the process's memory. The cache: SuffixCache. Memory: ~64 bytes a node.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::decode {

struct SuffixConfig {
  uint32_t depth_max = 24;                  // 1..256: longest substring recorded
  double probability_min = 0.1;             // (0, 1]: a draft stops below this path probability
  double match_factor = 1.0;                // > 0: draft tokens per matched token, at most
  uint32_t request_nodes_max = 1u << 17;    // >= 1: a request's own tree
  uint32_t cache_nodes_max = 1u << 20;      // >= 1: the instance's tree of recent outputs
  uint64_t cache_tokens_max = 1u << 18;     // >= 1: outputs the instance's tree keeps
  // invalid, naming the key, its value and its rule.
  Status validate() const;
};

struct SuffixDraft {
  std::vector<int32_t> tokens;
  double score = 0;           // expected accepted tokens (sum of the path's probabilities)
  uint32_t match_tokens = 0;  // the context suffix it continues
};

class SuffixTree {
 public:
  SuffixTree(uint32_t depth_max, uint32_t nodes_max);

  // A sequence appended token by token: the nodes of its suffixes (lengths 1..depth_max).
  struct Cursor {
    std::vector<uint32_t> active;  // node ids, by length - 1
  };
  void append(Cursor& cursor, int32_t token);
  // Every substring of a whole sequence (at most depth_max long), and undoing it exactly.
  // Precondition of remove (asserted): `tokens` was inserted, and no insert was refused
  // (nodes_refused() == 0: a refused substring cannot be told apart at removal).
  void insert(std::span<const int32_t> tokens);
  void remove(std::span<const int32_t> tokens);

  // The best draft continuing `context` (see above); empty tokens when none.
  SuffixDraft propose(std::span<const int32_t> context, uint32_t draft_tokens,
                      double probability_min, double match_factor) const;
  // The same from the nodes of the context's suffixes, by length - 1 (what a Cursor holds):
  // no walk from the root, O(nodes x draft_tokens).
  SuffixDraft propose_at(std::span<const uint32_t> suffix_nodes, uint32_t draft_tokens,
                         double probability_min, double match_factor) const;
  // A read-only cursor: the nodes of the context's suffixes after `token` is appended (the
  // tree unchanged), from the nodes before it.
  void advance(const Cursor& before, int32_t token, Cursor& after) const;
  // The nodes of `context`'s suffixes found by walking from the root (O(depth^2)).
  void locate(std::span<const int32_t> context, Cursor& out) const;
  // Changes with every insert and remove: a read-only cursor taken at another generation may
  // name freed nodes and is rebuilt (locate).
  uint64_t generation() const { return generation_; }
  // Occurrences of `substring` recorded (0 past depth_max or unrecorded).
  uint32_t count(std::span<const int32_t> substring) const;

  size_t nodes_count() const { return nodes_.size() - free_.size(); }
  uint64_t nodes_refused() const { return nodes_refused_; }
  uint32_t depth_max() const { return depth_max_; }
  void check_invariants() const;  // counts, followers, best children, links (tests)

 private:
  struct Node {
    int32_t token = 0;
    uint32_t parent = 0;
    uint32_t count = 0;
    uint32_t followers = 0;  // sum of the children's counts
    uint32_t first_child = 0, next_sibling = 0, best_child = 0;  // 0: none (0 is the root)
    uint16_t depth = 0;
  };
  static uint64_t edge_key(uint32_t parent, int32_t token) {
    return (uint64_t{parent} << 32) | static_cast<uint32_t>(token);
  }
  uint32_t child(uint32_t parent, int32_t token) const;  // 0: none
  uint32_t child_or_new(uint32_t parent, int32_t token);  // 0: the bound refused it
  void add(uint32_t node, int64_t delta);                  // count +-, parent's followers too
  void unlink(uint32_t node);                              // count reached 0
  void rebest(uint32_t node);                              // rescan the children
  uint32_t find(std::span<const int32_t> path) const;      // 0: not there (or empty path)
  SuffixDraft extend(uint32_t node, uint32_t match_tokens, uint32_t draft_tokens,
                     double probability_min) const;

  uint32_t depth_max_, nodes_max_;
  std::vector<Node> nodes_;  // [0] is the root
  std::vector<uint32_t> free_;
  std::unordered_map<uint64_t, uint32_t> edges_;  // (parent, token) -> child
  uint64_t nodes_refused_ = 0;
  uint64_t generation_ = 0;
};

// The instance's tree of recent outputs: added when a request ends, the oldest removed while
// more than cache_tokens_max tokens or cache_nodes_max nodes are kept (its tree refuses no
// node, so removal is exact; above the bound by at most one output's nodes, the newest, which
// is kept even alone).
class SuffixCache {
 public:
  explicit SuffixCache(const SuffixConfig& config);
  void add(std::vector<int32_t> output);
  const SuffixTree& tree() const { return tree_; }
  uint64_t tokens_count() const { return tokens_; }
  size_t outputs_count() const { return outputs_.size(); }

 private:
  uint64_t tokens_max_;
  uint32_t nodes_max_;
  SuffixTree tree_;
  std::deque<std::vector<int32_t>> outputs_;
  uint64_t tokens_ = 0;
};

// One request's proposer: its own tree, and the instance's cache (may be null).
class SuffixProposer {
 public:
  // Precondition (asserted): config.validate() is ok.
  SuffixProposer(const SuffixConfig& config, const SuffixCache* cache);
  void append(int32_t token);
  void append(std::span<const int32_t> tokens);
  SuffixDraft propose(uint32_t draft_tokens) const;
  std::span<const int32_t> tokens() const { return context_; }
  const SuffixTree& tree() const { return tree_; }

 private:
  SuffixConfig config_;
  const SuffixCache* cache_;
  SuffixTree tree_;
  SuffixTree::Cursor cursor_;
  std::vector<int32_t> context_;
  // The context's suffixes in the cache's tree, advanced per token while the cache does not
  // change, rebuilt when it did (its generation): proposals walk no tree from the root.
  mutable SuffixTree::Cursor cache_cursor_, cache_scratch_;
  mutable uint64_t cache_generation_ = ~uint64_t{0};
};

}  // namespace tandem::decode
