// The tier-2 store's on-disk format: RocksDB keys and values, the block checksum and the
// fingerprint digest. Pure functions (no I/O); the byte layouts are little-endian and fixed.
//
// RocksDB keys (one byte tag, then fixed fields):
//   'B' fingerprint_digest[16] block_hash[32]   -> IndexEntry (48 bytes)
//   'F' fingerprint_digest[16]                   -> the fingerprint's text (collision check)
//   'M' name                                     -> meta: "format" u32, "slot_bytes" u64,
//                                                   "generation" u64 (high-water mark)
// IndexEntry value: u32 entry_version (1) | u32 length_bytes | u64 slot_index |
//                   u64 checksum.low | u64 checksum.high | u64 last_use_tick | u64 generation
//
// Checksum: XXH3-128 over a 72-byte header
//   "T2BK" | u32 format_version | fingerprint_digest[16] | block_hash[32] |
//   u64 length_bytes | u64 generation
// followed by the block's length_bytes data bytes (slot padding excluded). Key and
// generation in the header make a slot that holds another block's bytes (an evicted entry
// resurrected by a crash, a misdirected or torn write, stale bytes of an older write) fail
// verification, not just a flipped bit.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvstore/block_hash.hpp"
#include "kvstore/tier2/slot_table.hpp"

namespace tandem::kv::tier2 {

inline constexpr uint32_t format_version_current = 1;
inline constexpr uint32_t index_entry_version = 1;
inline constexpr size_t block_key_bytes = 1 + 16 + 32;
inline constexpr size_t index_entry_bytes = 48;
inline constexpr char block_key_tag = 'B';
inline constexpr char fingerprint_key_tag = 'F';
inline constexpr char meta_key_tag = 'M';

struct FingerprintDigest {
  std::array<uint8_t, 16> bytes{};
  friend bool operator==(const FingerprintDigest&, const FingerprintDigest&) = default;
  std::string hex() const;  // 32 lowercase hex digits
};

// XXH3-128 of u64le(block_bytes) || fingerprint text: the 16 bytes every key starts with.
FingerprintDigest fingerprint_digest(std::string_view fingerprint_text, uint64_t block_bytes);

struct IndexEntry {
  uint64_t slot_index = 0;
  SlotMeta meta;
  friend bool operator==(const IndexEntry&, const IndexEntry&) = default;
};

struct BlockKey {
  FingerprintDigest fingerprint;
  BlockHash hash;
};

// XXH3-128 over the header described above, then data. Cost: one pass at cache/memory
// speed with the CPU's widest vector unit (runtime dispatch): ~60 GB/s on the build host's
// AVX-512 cores for a 1 MiB block in cache, i.e. ~20 us per MiB.
Checksum128 block_checksum(const FingerprintDigest& fingerprint, const BlockHash& hash,
                           uint64_t generation, std::span<const uint8_t> data);

std::string encode_block_key(const FingerprintDigest& fingerprint, const BlockHash& hash);
std::optional<BlockKey> decode_block_key(std::string_view key);  // nullopt: wrong tag/size
std::string encode_index_entry(const IndexEntry& entry);
// nullopt: wrong size or entry_version, or length_bytes 0.
std::optional<IndexEntry> decode_index_entry(std::string_view value);
std::string fingerprint_key(const FingerprintDigest& fingerprint);
std::string meta_key(std::string_view name);
std::string encode_u64(uint64_t value);
std::optional<uint64_t> decode_u64(std::string_view value);  // exactly 8 bytes

}  // namespace tandem::kv::tier2
