#include "kvstore/block_hash.hpp"

namespace tandem::kv {

std::string BlockHash::hex() const {
  static const char* digits = "0123456789abcdef";
  std::string out(64, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  return out;
}

}  // namespace tandem::kv
