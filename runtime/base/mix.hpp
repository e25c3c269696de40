// splitmix64's finalizer: a cheap, well-mixed 64-bit -> 64-bit bijection for deterministic
// pseudo-random streams and non-cryptographic hashing (workload generation, benchmarks,
// simulation). Not for anything an attacker controls: block hashes use kvstore's keyed hash.
#pragma once

#include <cstdint>

namespace tandem {

constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace tandem
