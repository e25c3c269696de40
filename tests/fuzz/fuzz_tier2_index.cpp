// Fuzz target: the tier-2 store's index decoders (kvstore/tier2/tier2_format.hpp), which read
// what RocksDB hands back at open (STYLE.md §8: disk bytes are outside bytes). Input: byte 0
// (mod 64) is the key's length, the key follows, the rest is the value. decode_block_key and
// decode_index_entry never crash; what they accept re-encodes to exactly the same bytes, a
// key has the block tag and 49 bytes, an entry a length >= 1; decode_u64 takes only 8 bytes.
//   libFuzzer: build-fuzz/tests/fuzz_tier2_index (tests/fuzz/README.md)
//   here: build/tests/fuzz_tier2_index_replay tests/fuzz/corpus/tier2_index (a test)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kvstore/tier2/tier2_format.hpp"

namespace {

void require(bool condition) {
  if (!condition) std::abort();  // a finding: the fuzzer (or the replay test) reports it
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace t2 = tandem::kv::tier2;
  if (size == 0) return 0;
  size_t key_bytes = data[0] % 64;
  if (key_bytes > size - 1) key_bytes = size - 1;
  std::string_view key(reinterpret_cast<const char*>(data) + 1, key_bytes);
  std::string_view value(reinterpret_cast<const char*>(data) + 1 + key_bytes,
                         size - 1 - key_bytes);
  if (auto k = t2::decode_block_key(key)) {
    require(key.size() == t2::block_key_bytes && key[0] == t2::block_key_tag);
    require(t2::encode_block_key(k->fingerprint, k->hash) == key);
  }
  if (auto e = t2::decode_index_entry(value)) {
    require(value.size() == t2::index_entry_bytes);
    require(e->meta.length_bytes >= 1);
    require(t2::encode_index_entry(*e) == value);
  }
  auto u = t2::decode_u64(value);
  require(u.has_value() == (value.size() == 8));
  if (u) require(t2::encode_u64(*u) == value);
  return 0;
}
