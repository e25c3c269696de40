// The router's view of tier 2 (issue 13): which blocks each node's kv-offload holds, from
// its KV events (stored / removed / all cleared). A "site" is a node: a prefill instance
// reads the tier 2 of its own node, or another node's over the fabric, so the router credits
// a tier-2 copy to the prefill instances of the node that holds it (tier2_weight) and, less,
// to the others (tier2_remote_weight; RouterCore).
//
// Per site, a set of block hashes; the hashes are chained (hash i identifies blocks 0..i), so
// a hit at position i means the same prefix, whatever tier 2 holds before it. With sub-blocks
// a partial block's hash (a sub-block prefix hash) is one more member of the set. Bounded:
// blocks_max per site; a stored event past it is refused (counted), never grown into.
// Pure, not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "actors/router/block_table.hpp"
#include "kvstore/block_hash.hpp"

namespace tandem::router {

class Tier2Index {
 public:
  explicit Tier2Index(uint32_t blocks_max);
  // Records blocks the site's tier 2 stored; returns how many were refused (blocks_max).
  size_t stored(uint32_t site, std::span<const kv::BlockHash> hashes);
  void removed(uint32_t site, std::span<const kv::BlockHash> hashes);
  void clear(uint32_t site);
  // A prompt's prefix hashes `q` (k per block, chained: q[k i + k - 1] names block i): how
  // many of its sub-blocks past block `from`'s start the site holds, as kv-offload would stage
  // them: consecutive whole blocks from `from`, then the longest partial block of the next
  // position (k > 1: tier 2 keeps a prompt's trailing partial block under its last full
  // sub-block's hash), unless `from` is already the trailing position: prefill asks for it
  // only with whole blocks (prefill::tier2_lack). k == 1: consecutive whole blocks.
  // Precondition: k * from <= q.size().
  uint32_t reach(uint32_t site, std::span<const kv::BlockHash> q, uint32_t k,
                 uint32_t from) const;
  bool holds(uint32_t site, const kv::BlockHash& hash) const;
  size_t blocks_count(uint32_t site) const;
  // Sites that hold at least one block, ascending.
  std::vector<uint32_t> sites_holding() const;
  uint64_t refused_count() const { return refused_count_; }
  uint32_t blocks_max() const { return blocks_max_; }

 private:
  uint32_t blocks_max_;
  uint64_t refused_count_ = 0;
  std::unordered_map<uint32_t, BlockTable> sites_;  // sites: nodes of the manifest
};

}  // namespace tandem::router
