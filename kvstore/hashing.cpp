#include "kvstore/hashing.hpp"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <bit>
#include <cstring>

#include "runtime/base/assert.hpp"

namespace tandem::kv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token ids are hashed as little-endian int32; add a byte swap for this host");

struct MacDeleter {
  void operator()(EVP_MAC* mac) const { EVP_MAC_free(mac); }
};
struct MacCtxDeleter {
  void operator()(EVP_MAC_CTX* ctx) const { EVP_MAC_CTX_free(ctx); }
};

void put_u32le(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

struct BlockHasher::Impl {
  std::unique_ptr<EVP_MAC, MacDeleter> mac;
  std::unique_ptr<EVP_MAC_CTX, MacCtxDeleter> ctx;
  std::string header;  // u32le(block_tokens), after the parent hash
  std::string extras;  // u32le(len(model)) || model || u32le(len(salt)) || salt
};

Result<BlockHasher> BlockHasher::create(const HashKey& key, uint32_t block_tokens) {
  if (key.secret.empty()) {
    return make_error(ErrorKind::invalid, "block hashing: the cluster secret is empty");
  }
  if (block_tokens == 0) {
    return make_error(ErrorKind::invalid, "block hashing: block_tokens must be at least 1");
  }
  auto impl = std::make_unique<Impl>();
  impl->mac.reset(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  if (!impl->mac) return make_error(ErrorKind::failed, "block hashing: OpenSSL has no HMAC");
  impl->ctx.reset(EVP_MAC_CTX_new(impl->mac.get()));
  if (!impl->ctx) return make_error(ErrorKind::failed, "block hashing: EVP_MAC_CTX_new failed");
  char digest_name[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
                         OSSL_PARAM_construct_end()};
  const auto* key_bytes = reinterpret_cast<const unsigned char*>(key.secret.data());
  if (EVP_MAC_init(impl->ctx.get(), key_bytes, key.secret.size(), params) != 1) {
    return make_error(ErrorKind::failed, "block hashing: HMAC-SHA-256 init failed");
  }
  put_u32le(impl->header, block_tokens);
  put_u32le(impl->extras, static_cast<uint32_t>(key.model.size()));
  impl->extras += key.model;
  put_u32le(impl->extras, static_cast<uint32_t>(key.salt.size()));
  impl->extras += key.salt;
  return BlockHasher(std::move(impl), block_tokens);
}

BlockHasher::BlockHasher(std::unique_ptr<Impl> impl, uint32_t block_tokens)
    : impl_(std::move(impl)), block_tokens_(block_tokens) {
  RT_ASSERT(impl_ != nullptr);
  RT_ASSERT(block_tokens_ > 0);
  pending_.reserve(block_tokens_);
}

BlockHasher::BlockHasher(BlockHasher&&) noexcept = default;
BlockHasher& BlockHasher::operator=(BlockHasher&&) noexcept = default;
BlockHasher::~BlockHasher() = default;

BlockHash BlockHasher::hash_block(const BlockHash* parent, std::span<const TokenId> tokens) {
  RT_ASSERT(impl_ != nullptr, "BlockHasher used after move");
  RT_ASSERT(tokens.size() == block_tokens_, tokens.size(), block_tokens_);
  static const BlockHash root{};
  EVP_MAC_CTX* ctx = impl_->ctx.get();
  // A null key re-initialises from the precomputed padded-key states (no key schedule).
  bool ok = EVP_MAC_init(ctx, nullptr, 0, nullptr) == 1;
  const BlockHash& p = parent != nullptr ? *parent : root;
  ok = ok && EVP_MAC_update(ctx, p.bytes.data(), p.bytes.size()) == 1;
  const auto* header = reinterpret_cast<const unsigned char*>(impl_->header.data());
  ok = ok && EVP_MAC_update(ctx, header, impl_->header.size()) == 1;
  const auto* token_bytes = reinterpret_cast<const unsigned char*>(tokens.data());
  ok = ok && EVP_MAC_update(ctx, token_bytes, tokens.size_bytes()) == 1;
  const auto* extras = reinterpret_cast<const unsigned char*>(impl_->extras.data());
  ok = ok && EVP_MAC_update(ctx, extras, impl_->extras.size()) == 1;
  BlockHash out;
  size_t out_bytes = 0;
  ok = ok && EVP_MAC_final(ctx, out.bytes.data(), &out_bytes, out.bytes.size()) == 1;
  // OpenSSL failing here after a successful init means memory corruption or a broken build.
  RT_ASSERT(ok, "HMAC-SHA-256 update/final failed");
  RT_ASSERT(out_bytes == out.bytes.size(), out_bytes);
  return out;
}

void BlockHasher::append(std::span<const TokenId> tokens, std::vector<BlockHash>& out) {
  RT_ASSERT(pending_.size() < block_tokens_, pending_.size());
  size_t at = 0;
  // Complete the open block first.
  if (!pending_.empty()) {
    size_t take = std::min<size_t>(block_tokens_ - pending_.size(), tokens.size());
    pending_.insert(pending_.end(), tokens.begin(), tokens.begin() + take);
    at = take;
    if (pending_.size() < block_tokens_) return;
    parent_ = hash_block(blocks_count_ == 0 ? nullptr : &parent_, pending_);
    out.push_back(parent_);
    ++blocks_count_;
    pending_.clear();
  }
  // Whole blocks straight from the input, no copy.
  while (tokens.size() - at >= block_tokens_) {
    parent_ =
        hash_block(blocks_count_ == 0 ? nullptr : &parent_, tokens.subspan(at, block_tokens_));
    out.push_back(parent_);
    ++blocks_count_;
    at += block_tokens_;
  }
  pending_.insert(pending_.end(), tokens.begin() + at, tokens.end());
  RT_ASSERT(pending_.size() < block_tokens_, pending_.size());
}

void BlockHasher::reset() {
  blocks_count_ = 0;
  parent_ = BlockHash{};
  pending_.clear();
}

Result<std::vector<BlockHash>> hash_blocks(std::span<const TokenId> tokens, uint32_t block_tokens,
                                           const HashKey& key) {
  auto hasher = BlockHasher::create(key, block_tokens);
  if (!hasher) return hasher.error();
  std::vector<BlockHash> out;
  out.reserve(tokens.size() / block_tokens);
  hasher->append(tokens, out);
  RT_ASSERT(out.size() == tokens.size() / block_tokens, out.size(), tokens.size());
  return out;
}

}  // namespace tandem::kv
