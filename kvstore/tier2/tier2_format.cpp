#include "kvstore/tier2/tier2_format.hpp"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
// XXH3 with the widest vector unit the CPU has (AVX2/AVX-512; the plain entry points are
// SSE2): ~60 GB/s instead of ~16 on the build host. Same results, only faster.
#include <xxh_x86dispatch.h>
#endif

#include <cstring>

#include "runtime/base/assert.hpp"

namespace tandem::kv::tier2 {
namespace {

void put_le(std::string& out, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t get_le(std::string_view in, size_t at, size_t bytes) {
  RT_ASSERT(at + bytes <= in.size(), "get_le past the end", at, bytes, in.size());
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) {
    value |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
  }
  return value;
}

std::string checksum_header(const FingerprintDigest& fingerprint, const BlockHash& hash,
                            uint64_t length_bytes, uint64_t generation) {
  std::string header = "T2BK";
  put_le(header, format_version_current, 4);
  header.append(reinterpret_cast<const char*>(fingerprint.bytes.data()), fingerprint.bytes.size());
  header.append(reinterpret_cast<const char*>(hash.bytes.data()), hash.bytes.size());
  put_le(header, length_bytes, 8);
  put_le(header, generation, 8);
  RT_ASSERT(header.size() == 72, "checksum header size", header.size());
  return header;
}

}  // namespace

std::string FingerprintDigest::hex() const {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

FingerprintDigest fingerprint_digest(std::string_view fingerprint_text, uint64_t block_bytes) {
  std::string input;
  put_le(input, block_bytes, 8);
  input.append(fingerprint_text);
  XXH128_hash_t h = XXH3_128bits(input.data(), input.size());
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, h);
  FingerprintDigest digest;
  static_assert(sizeof(canonical.digest) == 16);
  std::memcpy(digest.bytes.data(), canonical.digest, 16);
  RT_ASSERT(input.size() == 8 + fingerprint_text.size(), "digest input size");
  return digest;
}

Checksum128 block_checksum(const FingerprintDigest& fingerprint, const BlockHash& hash,
                           uint64_t generation, std::span<const uint8_t> data) {
  std::string header = checksum_header(fingerprint, hash, data.size(), generation);
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  RT_ASSERT(XXH3_128bits_reset(&state) == XXH_OK, "XXH3 reset failed");
  RT_ASSERT(XXH3_128bits_update(&state, header.data(), header.size()) == XXH_OK, "XXH3 update");
  if (!data.empty()) {
    RT_ASSERT(XXH3_128bits_update(&state, data.data(), data.size()) == XXH_OK, "XXH3 update");
  }
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return Checksum128{h.low64, h.high64};
}

std::string encode_block_key(const FingerprintDigest& fingerprint, const BlockHash& hash) {
  std::string key(1, block_key_tag);
  key.append(reinterpret_cast<const char*>(fingerprint.bytes.data()), fingerprint.bytes.size());
  key.append(reinterpret_cast<const char*>(hash.bytes.data()), hash.bytes.size());
  RT_ASSERT(key.size() == block_key_bytes, "block key size", key.size());
  return key;
}

std::optional<BlockKey> decode_block_key(std::string_view key) {
  if (key.size() != block_key_bytes || key[0] != block_key_tag) return std::nullopt;
  BlockKey out;
  std::memcpy(out.fingerprint.bytes.data(), key.data() + 1, 16);
  std::memcpy(out.hash.bytes.data(), key.data() + 17, 32);
  RT_ASSERT(encode_block_key(out.fingerprint, out.hash) == key, "block key does not round-trip");
  return out;
}

std::string encode_index_entry(const IndexEntry& entry) {
  RT_ASSERT(entry.meta.length_bytes > 0, "index entry of an empty block");
  std::string value;
  put_le(value, index_entry_version, 4);
  put_le(value, entry.meta.length_bytes, 4);
  put_le(value, entry.slot_index, 8);
  put_le(value, entry.meta.checksum.low, 8);
  put_le(value, entry.meta.checksum.high, 8);
  put_le(value, entry.meta.last_use_tick, 8);
  put_le(value, entry.meta.generation, 8);
  RT_ASSERT(value.size() == index_entry_bytes, "index entry size", value.size());
  return value;
}

std::optional<IndexEntry> decode_index_entry(std::string_view value) {
  if (value.size() != index_entry_bytes) return std::nullopt;
  if (get_le(value, 0, 4) != index_entry_version) return std::nullopt;
  IndexEntry e;
  e.meta.length_bytes = static_cast<uint32_t>(get_le(value, 4, 4));
  e.slot_index = get_le(value, 8, 8);
  e.meta.checksum.low = get_le(value, 16, 8);
  e.meta.checksum.high = get_le(value, 24, 8);
  e.meta.last_use_tick = get_le(value, 32, 8);
  e.meta.generation = get_le(value, 40, 8);
  if (e.meta.length_bytes == 0) return std::nullopt;
  RT_ASSERT(encode_index_entry(e) == value, "index entry does not round-trip");
  return e;
}

std::string fingerprint_key(const FingerprintDigest& fingerprint) {
  std::string key(1, fingerprint_key_tag);
  key.append(reinterpret_cast<const char*>(fingerprint.bytes.data()), fingerprint.bytes.size());
  return key;
}

std::string meta_key(std::string_view name) {
  std::string key(1, meta_key_tag);
  key.append(name);
  return key;
}

std::string encode_u64(uint64_t value) {
  std::string out;
  put_le(out, value, 8);
  return out;
}

std::optional<uint64_t> decode_u64(std::string_view value) {
  if (value.size() != 8) return std::nullopt;
  return get_le(value, 0, 8);
}

}  // namespace tandem::kv::tier2
