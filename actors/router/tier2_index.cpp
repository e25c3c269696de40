#include "actors/router/tier2_index.hpp"

#include <algorithm>

#include "runtime/base/assert.hpp"

namespace tandem::router {

std::vector<uint32_t> Tier2Index::sites_holding() const {
  std::vector<uint32_t> out;
  for (const auto& [site, table] : sites_) {
    if (blocks_count(site) > 0) out.push_back(site);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Tier2Index::Tier2Index(uint32_t blocks_max) : blocks_max_(blocks_max) {
  RT_ASSERT(blocks_max_ >= 1);
}

size_t Tier2Index::stored(uint32_t site, std::span<const kv::BlockHash> hashes) {
  BlockTable& table = sites_[site];
  size_t refused = 0;
  for (const kv::BlockHash& hash : hashes) {
    if (table.find(hash) != nullptr) continue;
    if (table.size() >= blocks_max_) {
      ++refused;
      continue;
    }
    table.insert(hash, site, 0);
  }
  refused_count_ += refused;
  RT_ASSERT(table.size() <= blocks_max_, table.size());
  return refused;
}

void Tier2Index::removed(uint32_t site, std::span<const kv::BlockHash> hashes) {
  auto it = sites_.find(site);
  if (it == sites_.end()) return;
  for (const kv::BlockHash& hash : hashes) it->second.erase(hash);
}

void Tier2Index::clear(uint32_t site) { sites_.erase(site); }

uint32_t Tier2Index::reach(uint32_t site, std::span<const kv::BlockHash> q, uint32_t k,
                           uint32_t from) const {
  RT_ASSERT(k >= 1 && size_t{k} * from <= q.size(), k, from, q.size());
  auto it = sites_.find(site);
  if (it == sites_.end() || it->second.empty()) return 0;
  const BlockTable& held = it->second;
  size_t b = from;
  while (k * b + k <= q.size() && held.find(q[k * b + k - 1]) != nullptr) ++b;
  uint32_t partial = 0;
  // Prefill asks for a trailing partial block only with whole blocks (prefill::tier2_lack).
  const bool whole_lacked = size_t{k} * from + k <= q.size();
  const size_t have = whole_lacked ? std::min<size_t>(k - 1, q.size() - k * b) : 0;
  for (size_t j = have; j-- > 0;) {
    if (held.find(q[k * b + j]) != nullptr) {
      partial = static_cast<uint32_t>(j + 1);
      break;
    }
  }
  const auto reached = static_cast<uint32_t>((b - from) * k + partial);
  RT_ASSERT(size_t{k} * from + reached <= q.size(), from, reached);
  return reached;
}

bool Tier2Index::holds(uint32_t site, const kv::BlockHash& hash) const {
  auto it = sites_.find(site);
  return it != sites_.end() && it->second.find(hash) != nullptr;
}

size_t Tier2Index::blocks_count(uint32_t site) const {
  auto it = sites_.find(site);
  return it == sites_.end() ? 0 : it->second.size();
}

}  // namespace tandem::router
