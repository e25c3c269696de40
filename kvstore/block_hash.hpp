// The identity of a full KV block: a chained, keyed cryptographic hash of
// (parent block hash, the block's token ids, extra keys such as model and cache salt).
// Computed once per prompt at the gateway and carried with the request; every other role
// (router, prefill, decode, kv-offload) only compares them.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace tandem::kv {

struct BlockHash {
  std::array<uint8_t, 32> bytes{};

  friend bool operator==(const BlockHash&, const BlockHash&) = default;
  friend auto operator<=>(const BlockHash&, const BlockHash&) = default;
  // First 8 bytes as an integer: already uniformly distributed, good for hash tables.
  uint64_t prefix64() const {
    uint64_t v;
    std::memcpy(&v, bytes.data(), sizeof(v));
    return v;
  }
  std::string hex() const;  // 64 lowercase hex digits
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.prefix64()); }
};

using BlockIndex = uint32_t;  // a block's slot in one device's KV pool

}  // namespace tandem::kv
