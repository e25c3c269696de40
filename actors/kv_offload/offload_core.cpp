#include "actors/kv_offload/offload_core.hpp"

#include <algorithm>

#include "runtime/base/assert.hpp"

namespace tandem::kv_offload {

Status OffloadConfig::validate() const {
  auto bad = [](const char* key, const char* why) {
    return make_error(ErrorKind::invalid, std::string("kv_offload.") + key + ": " + why);
  };
  if (staging_blocks == 0) return bad("staging_blocks", "must be at least 1");
  if (stores_max == 0) return bad("stores_max", "must be at least 1");
  if (lookups_max == 0) return bad("lookups_max", "must be at least 1");
  if (lookup_blocks_max == 0) return bad("lookup_blocks_max", "must be at least 1");
  if (known_blocks_max == 0) return bad("known_blocks_max", "must be at least 1");
  if (hold_timeout.count() <= 0) return bad("hold_timeout_ms", "must be positive");
  return {};
}

OffloadCore::OffloadCore(OffloadConfig config) : config_(config) {
  Status valid = config_.validate();
  RT_ASSERT(valid.ok(), valid.ok() ? "" : valid.error().describe());
  free_.reserve(config_.staging_blocks);
  // Slot 0 handed out first (free_ is a stack).
  for (Slot s = config_.staging_blocks; s > 0; --s) free_.push_back(s - 1);
  RT_ASSERT(free_.size() == config_.staging_blocks, free_.size());
}

std::optional<Slot> OffloadCore::take_slot() {
  if (free_.empty()) return std::nullopt;
  Slot s = free_.back();
  free_.pop_back();
  RT_ASSERT(s < config_.staging_blocks, s);
  return s;
}

void OffloadCore::free_slot(Slot slot) {
  RT_ASSERT(slot < config_.staging_blocks, slot);
  RT_ASSERT(free_.size() < config_.staging_blocks, "a slot freed twice", slot);
  free_.push_back(slot);
}

void OffloadCore::remember(const kv::BlockHash& hash) {
  if (known_.count(hash)) return;
  // The store's capacity bounds what it holds; a belief dropped here only costs a miss.
  if (known_.size() >= config_.known_blocks_max) known_.erase(known_.begin());
  known_.insert(hash);
  RT_ASSERT(known_.size() <= config_.known_blocks_max, known_.size());
}

Result<std::vector<StoreGrant>> OffloadCore::begin_store(const RequestKey& key,
                                                         std::span<const kv::BlockHash> offered) {
  if (stores_.count(key)) {
    return make_error(ErrorKind::invalid, "kv-offload: store " + std::to_string(key.request) +
                                              " from " + key.requester + " is already in flight");
  }
  counters_.store_offered_blocks += offered.size();
  if (stores_.size() >= config_.stores_max) {
    counters_.store_dropped_blocks += offered.size();
    return make_error(ErrorKind::overloaded, "kv-offload: " + std::to_string(stores_.size()) +
                                                 " stores in flight (kv_offload.stores_max)");
  }
  std::vector<StoreGrant> grants;
  Store store;
  for (uint32_t i = 0; i < offered.size(); ++i) {
    const kv::BlockHash& h = offered[i];
    if (known_.count(h) || in_flight_.count(h)) {
      ++counters_.store_known_blocks;
      continue;
    }
    auto slot = take_slot();
    if (!slot) {
      ++counters_.store_dropped_blocks;
      continue;
    }
    in_flight_.insert(h);
    store.reading.emplace(*slot, h);
    grants.push_back({i, *slot});
  }
  if (!grants.empty()) stores_.emplace(key, std::move(store));
  RT_ASSERT(grants.size() <= offered.size(), grants.size());
  RT_ASSERT(stores_.size() <= config_.stores_max, stores_.size());
  return grants;
}

Result<std::optional<std::vector<StoreWrite>>> OffloadCore::store_read_done(const RequestKey& key,
                                                                            Slot slot, bool ok) {
  auto it = stores_.find(key);
  if (it == stores_.end()) {
    return make_error(ErrorKind::not_found, "kv-offload: no store " + std::to_string(key.request));
  }
  Store& store = it->second;
  auto r = store.reading.find(slot);
  if (r == store.reading.end()) {
    return make_error(ErrorKind::not_found, "kv-offload: slot " + std::to_string(slot) +
                                                " is not being read for this store");
  }
  kv::BlockHash hash = r->second;
  store.reading.erase(r);
  if (ok) {
    store.read.push_back({slot, hash});
  } else {
    ++counters_.store_read_failed_blocks;
    in_flight_.erase(hash);
    free_slot(slot);
  }
  if (!store.reading.empty()) return std::optional<std::vector<StoreWrite>>{};
  std::vector<StoreWrite> writes = std::move(store.read);
  stores_.erase(it);
  for (const auto& w : writes) {
    RT_ASSERT(!writing_.count(w.slot), w.slot);
    writing_.emplace(w.slot, w.hash);
  }
  return std::optional<std::vector<StoreWrite>>{std::move(writes)};
}

Status OffloadCore::store_written(Slot slot, bool ok) {
  auto it = writing_.find(slot);
  if (it == writing_.end()) {
    return make_error(ErrorKind::not_found,
                      "kv-offload: slot " + std::to_string(slot) + " has no write in flight");
  }
  kv::BlockHash hash = it->second;
  writing_.erase(it);
  in_flight_.erase(hash);
  free_slot(slot);
  if (ok) {
    remember(hash);
    ++counters_.stored_blocks;
  } else {
    ++counters_.store_write_failed_blocks;
  }
  RT_ASSERT(!in_flight_.count(hash), "a stored hash is no longer in flight");
  return {};
}

uint32_t lookup_positions(std::span<const kv::BlockHash> hashes, const PartialAsk& partial) {
  if (partial.q.empty() || partial.k <= 1) return static_cast<uint32_t>(hashes.size());
  return static_cast<uint32_t>((partial.q.size() + partial.k - 1) / partial.k);
}

Status check_partial_ask(std::span<const kv::BlockHash> hashes, const PartialAsk& partial) {
  if (partial.q.empty()) return {};
  const size_t k = partial.k;
  if (k < 1) return make_error(ErrorKind::invalid, "kv-offload: a lookup's sub-blocks per block is 0");
  if (partial.held >= k) {
    return make_error(ErrorKind::invalid, "kv-offload: a lookup holds " +
                                              std::to_string(partial.held) +
                                              " sub-blocks of its first block, not below its " +
                                              std::to_string(k) + " sub-blocks per block");
  }
  if (partial.q.size() / k != hashes.size()) {
    return make_error(ErrorKind::invalid,
                      "kv-offload: a lookup's " + std::to_string(partial.q.size()) +
                          " sub-block hashes make " + std::to_string(partial.q.size() / k) +
                          " whole blocks of " + std::to_string(k) + ", not the " +
                          std::to_string(hashes.size()) + " block hashes it asks for");
  }
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (partial.q[k * i + k - 1] != hashes[i]) {
      return make_error(ErrorKind::invalid, "kv-offload: a lookup's sub-block hash " +
                                                std::to_string(k * i + k - 1) +
                                                " is not its block hash " + std::to_string(i));
    }
  }
  return {};
}

void truncate_ask(std::vector<kv::BlockHash>& hashes, std::vector<kv::BlockHash>& q, uint32_t k,
                  uint32_t positions) {
  hashes.resize(std::min<size_t>(hashes.size(), positions));
  q.resize(std::min<size_t>(q.size(), size_t{k} * positions));
}

Result<std::vector<LookupGrant>> OffloadCore::begin_lookup(const RequestKey& key,
                                                           std::span<const kv::BlockHash> hashes,
                                                           std::chrono::nanoseconds now,
                                                           const PartialAsk& partial) {
  if (lookups_.count(key)) {
    return make_error(ErrorKind::invalid, "kv-offload: lookup " + std::to_string(key.request) +
                                              " from " + key.requester + " is already in flight");
  }
  RT_ASSERT(check_partial_ask(hashes, partial).ok(), hashes.size(), partial.q.size());
  ++counters_.lookups;
  if (lookups_.size() >= config_.lookups_max) {
    ++counters_.lookup_refused;
    return make_error(ErrorKind::overloaded, "kv-offload: " + std::to_string(lookups_.size()) +
                                                 " lookups in flight (kv_offload.lookups_max)");
  }
  Lookup lookup;
  lookup.since = now;
  const size_t limit = std::min<size_t>(lookup_positions(hashes, partial), config_.lookup_blocks_max);
  bool out_of_slots = false;
  uint32_t i = 0;
  for (; i < limit && i < hashes.size() && known_.count(hashes[i]); ++i) {
    auto slot = take_slot();
    if (!slot) {
      out_of_slots = true;
      break;
    }
    lookup.grants.push_back({i, *slot, hashes[i], 0});
    lookup.hashes.push_back(hashes[i]);
  }
  if (!out_of_slots && i < limit && !partial.q.empty() && partial.k > 1) {
    // Position i's sub-block prefixes other than the whole block, longest first.
    const size_t k = partial.k;
    const size_t have = std::min(k - 1, partial.q.size() - k * i);
    // The asker has `held` of position 0; a partial must add gain_min past what it has.
    const size_t least = (i == 0 ? partial.held : 0) + std::max<uint32_t>(1, partial.gain_min);
    for (size_t j = have; j-- > 0 && j + 1 >= least;) {
      const kv::BlockHash& h = partial.q[k * i + j];
      if (!known_.count(h)) continue;
      if (auto slot = take_slot()) {
        lookup.grants.push_back({i, *slot, h, static_cast<uint32_t>(j + 1)});
        lookup.hashes.push_back(h);
      }
      break;
    }
  }
  lookup.state.assign(lookup.grants.size(), 0);
  lookup.reading_count = static_cast<uint32_t>(lookup.grants.size());
  std::vector<LookupGrant> grants = lookup.grants;
  if (!grants.empty()) lookups_.emplace(key, std::move(lookup));
  RT_ASSERT(lookups_.size() <= config_.lookups_max, lookups_.size());
  RT_ASSERT(grants.size() <= limit, grants.size());
  return grants;
}

Result<std::optional<std::vector<LookupGrant>>> OffloadCore::lookup_read_done(
    const RequestKey& key, uint32_t position, bool ok) {
  auto it = lookups_.find(key);
  if (it == lookups_.end() || it->second.staged) {
    return make_error(ErrorKind::not_found,
                      "kv-offload: no lookup " + std::to_string(key.request) + " reading");
  }
  Lookup& l = it->second;
  if (position >= l.grants.size() || l.state[position] != 0) {
    return make_error(ErrorKind::not_found,
                      "kv-offload: position " + std::to_string(position) + " is not being read");
  }
  l.state[position] = ok ? 1 : 2;
  --l.reading_count;
  if (!ok) {
    ++counters_.lookup_miss_blocks;
    known_.erase(l.hashes[position]);  // the store dropped it (corrupt, I/O error, evicted)
  }
  if (l.reading_count > 0) return std::optional<std::vector<LookupGrant>>{};
  // The staged prefix ends at the first miss; the slots after it are freed at once.
  size_t prefix = 0;
  while (prefix < l.grants.size() && l.state[prefix] == 1) ++prefix;
  for (size_t i = prefix; i < l.grants.size(); ++i) free_slot(l.grants[i].slot);
  l.grants.resize(prefix);
  l.hashes.resize(prefix);
  l.state.resize(prefix);
  counters_.lookup_hit_blocks += prefix;
  if (prefix > 0 && l.grants[prefix - 1].sub_blocks > 0) ++counters_.lookup_partial_blocks;
  l.staged = true;
  std::vector<LookupGrant> staged = l.grants;
  if (staged.empty()) lookups_.erase(it);  // nothing staged: nothing to release
  return std::optional<std::vector<LookupGrant>>{std::move(staged)};
}

Status OffloadCore::lookup_released(const RequestKey& key) {
  auto it = lookups_.find(key);
  if (it == lookups_.end() || !it->second.staged) {
    return make_error(ErrorKind::not_found,
                      "kv-offload: no staged lookup " + std::to_string(key.request));
  }
  for (const auto& g : it->second.grants) free_slot(g.slot);
  lookups_.erase(it);
  return {};
}

std::vector<RequestKey> OffloadCore::expire(std::chrono::nanoseconds now) {
  std::vector<RequestKey> expired;
  for (auto it = lookups_.begin(); it != lookups_.end();) {
    // Only staged lookups expire: a disk read in flight owns its slot until it ends.
    if (it->second.staged && now - it->second.since > config_.hold_timeout) {
      for (const auto& g : it->second.grants) free_slot(g.slot);
      expired.push_back(it->first);
      ++counters_.holds_expired;
      it = lookups_.erase(it);
    } else {
      ++it;
    }
  }
  return expired;
}

void OffloadCore::note_removed(const kv::BlockHash& hash) { known_.erase(hash); }

uint32_t blocks_within_budget(uint32_t asked, uint64_t block_bytes, double budget_s,
                              double queued_bytes, double disk_bytes_per_s) {
  if (!(budget_s > 0.0) || !(disk_bytes_per_s > 0.0) || block_bytes == 0) return asked;
  double left_s = budget_s - std::max(0.0, queued_bytes) / disk_bytes_per_s;
  if (!(left_s > 0.0)) return 0;
  double blocks = left_s * disk_bytes_per_s / static_cast<double>(block_bytes);
  if (!(blocks < static_cast<double>(asked))) return asked;  // also catches +inf
  return static_cast<uint32_t>(blocks);
}

void OffloadCore::note_held(const kv::BlockHash& hash) { remember(hash); }

void OffloadCore::check_invariants() const {
  std::vector<int> owners(config_.staging_blocks, 0);
  for (Slot s : free_) ++owners.at(s);
  for (const auto& [key, store] : stores_) {
    RT_ASSERT(!store.reading.empty(), "a store with no read in flight is finished", key.request);
    for (const auto& [slot, hash] : store.reading) {
      ++owners.at(slot);
      RT_ASSERT(in_flight_.count(hash), slot);
    }
    for (const auto& w : store.read) ++owners.at(w.slot);
  }
  for (const auto& [slot, hash] : writing_) {
    ++owners.at(slot);
    RT_ASSERT(in_flight_.count(hash), slot);
  }
  for (const auto& [key, lookup] : lookups_) {
    RT_ASSERT(!lookup.grants.empty(), key.request);
    for (const auto& g : lookup.grants) ++owners.at(g.slot);
  }
  for (Slot s = 0; s < config_.staging_blocks; ++s) {
    RT_ASSERT(owners[s] == 1, "slot owned by other than exactly one", s, owners[s]);
  }
  RT_ASSERT(known_.size() <= config_.known_blocks_max, known_.size());
  RT_ASSERT(stores_.size() <= config_.stores_max && lookups_.size() <= config_.lookups_max);
}

}  // namespace tandem::kv_offload
