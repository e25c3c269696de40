#include <doctest.h>

#include <numeric>
#include <vector>

#include "kvstore/hashing.hpp"

using tandem::ErrorKind;
using tandem::kv::BlockHash;
using tandem::kv::BlockHasher;
using tandem::kv::hash_blocks;
using tandem::kv::HashKey;
using tandem::kv::TokenId;

namespace {

std::vector<TokenId> iota_tokens(size_t count, TokenId first = 1) {
  std::vector<TokenId> tokens(count);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

const HashKey key{"cluster-secret", "minimax-m2.7", ""};

std::vector<BlockHash> hashes(const std::vector<TokenId>& tokens, uint32_t block_tokens,
                              const HashKey& k = key) {
  auto result = hash_blocks(tokens, block_tokens, k);
  REQUIRE(result.ok());
  return std::move(result).value();
}

}  // namespace

TEST_CASE("hashing is deterministic and hashes only full blocks") {
  auto tokens = iota_tokens(50);
  auto a = hashes(tokens, 16);
  auto b = hashes(tokens, 16);
  CHECK(a.size() == 3);  // 48 of 50 tokens: the partial block is excluded
  CHECK(a == b);
  CHECK(a[0] != a[1]);
  CHECK(a[1] != a[2]);
  CHECK(hashes(iota_tokens(15), 16).empty());
  CHECK(hashes(iota_tokens(16), 16).size() == 1);
  CHECK(a[0].hex().size() == 64);
}

TEST_CASE("a known vector stays fixed (the wire identity must not drift)") {
  // Computed independently with Python: hmac.new(b"k", bytes(32) + pack("<I", 4) +
  // pack("<4i", 1, 2, 3, 4) + pack("<I", 1) + b"m" + pack("<I", 0), sha256).hexdigest()
  std::vector<TokenId> tokens{1, 2, 3, 4};
  auto h = hashes(tokens, 4, HashKey{"k", "m", ""});
  REQUIRE(h.size() == 1);
  CHECK(h[0].hex() == "dd25a904dd10fa13ceec4735ff5929fd59a36586fb348a32d29c7dbd0a0db6c7");
}

TEST_CASE("every input changes the hash") {
  auto tokens = iota_tokens(64);
  auto base = hashes(tokens, 16);
  SUBCASE("a token in the first block changes that block and every later one") {
    auto t = tokens;
    t[3] = 999;
    auto h = hashes(t, 16);
    for (size_t i = 0; i < h.size(); ++i) CHECK(h[i] != base[i]);
  }
  SUBCASE("a token in the third block leaves the first two alone") {
    auto t = tokens;
    t[40] = -7;
    auto h = hashes(t, 16);
    CHECK(h[0] == base[0]);
    CHECK(h[1] == base[1]);
    CHECK(h[2] != base[2]);
    CHECK(h[3] != base[3]);
  }
  SUBCASE("the parent changes the child") {
    auto hasher = BlockHasher::create(key, 16);
    REQUIRE(hasher.ok());
    std::span<const TokenId> second(tokens.data() + 16, 16);
    CHECK(hasher->hash_block(&base[0], second) == base[1]);
    BlockHash other = base[0];
    other.bytes[31] ^= 1;
    CHECK(hasher->hash_block(&other, second) != base[1]);
    CHECK(hasher->hash_block(nullptr, second) != base[1]);
  }
  SUBCASE("model, salt and secret each change every hash") {
    for (const HashKey& k : {HashKey{"cluster-secret", "other-model", ""},
                             HashKey{"cluster-secret", "minimax-m2.7", "tenant-a"},
                             HashKey{"cluster-secret2", "minimax-m2.7", ""}}) {
      auto h = hashes(tokens, 16, k);
      for (size_t i = 0; i < h.size(); ++i) CHECK(h[i] != base[i]);
    }
  }
  SUBCASE("the same token ids under a different block size do not collide") {
    auto h8 = hashes(tokens, 8);
    for (const auto& x : h8) {
      for (const auto& y : base) CHECK(x != y);
    }
  }
  SUBCASE("model/salt boundaries are unambiguous") {
    auto a = hashes(tokens, 16, HashKey{"s", "ab", "c"});
    auto b = hashes(tokens, 16, HashKey{"s", "a", "bc"});
    CHECK(a[0] != b[0]);
  }
}

TEST_CASE("prefix property: hashes of a prefix are a prefix of the hashes") {
  auto tokens = iota_tokens(1000, -500);
  auto full = hashes(tokens, 16);
  for (size_t n : {0u, 1u, 15u, 16u, 17u, 100u, 511u, 512u, 999u}) {
    std::vector<TokenId> prefix(tokens.begin(), tokens.begin() + static_cast<long>(n));
    auto h = hashes(prefix, 16);
    REQUIRE(h.size() == n / 16);
    CHECK(std::equal(h.begin(), h.end(), full.begin()));
  }
}

TEST_CASE("streaming in arbitrary pieces equals one-shot hashing") {
  auto tokens = iota_tokens(777);
  auto expected = hashes(tokens, 16);
  auto hasher = BlockHasher::create(key, 16);
  REQUIRE(hasher.ok());
  std::vector<BlockHash> got;
  size_t at = 0;
  size_t piece = 1;
  while (at < tokens.size()) {
    size_t n = std::min(piece, tokens.size() - at);
    hasher->append(std::span<const TokenId>(tokens.data() + at, n), got);
    at += n;
    piece = piece * 3 % 41 + 1;  // 1..41, crossing block boundaries in every way
  }
  CHECK(got == expected);
  CHECK(hasher->blocks_count() == expected.size());
  CHECK(hasher->pending_tokens_count() == tokens.size() % 16);
  hasher->append({}, got);
  CHECK(got.size() == expected.size());
  hasher->reset();
  std::vector<BlockHash> again;
  hasher->append(tokens, again);
  CHECK(again == expected);
}

TEST_CASE("bad keys and block sizes are errors, not crashes") {
  auto tokens = iota_tokens(32);
  auto no_secret = hash_blocks(tokens, 16, HashKey{"", "m", ""});
  REQUIRE_FALSE(no_secret.ok());
  CHECK(no_secret.error().kind == ErrorKind::invalid);
  CHECK(no_secret.error().message.find("secret") != std::string::npos);
  auto zero_block = hash_blocks(tokens, 0, key);
  REQUIRE_FALSE(zero_block.ok());
  CHECK(zero_block.error().kind == ErrorKind::invalid);
  CHECK(zero_block.error().message.find("block_tokens") != std::string::npos);
}
