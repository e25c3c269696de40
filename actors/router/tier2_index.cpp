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

uint32_t Tier2Index::run(uint32_t site, std::span<const kv::BlockHash> hashes,
                         uint32_t from) const {
  auto it = sites_.find(site);
  if (it == sites_.end() || it->second.empty()) return 0;
  uint32_t count = 0;
  for (size_t i = from; i < hashes.size(); ++i) {
    if (it->second.find(hashes[i]) == nullptr) break;
    ++count;
  }
  RT_ASSERT(from + count <= hashes.size(), from, count);
  return count;
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
