#include "kvstore/tier2/faulty_block_file.hpp"

#include <cerrno>
#include <cstring>

namespace tandem::kv::tier2 {
namespace {

Error injected_error(FaultKind kind, int err) {
  return make_error(ErrorKind::failed, std::string("injected ") + std::string(to_string(kind)) +
                                           ": " + std::strerror(err) + " (errno " +
                                           std::to_string(err) + ")");
}

void check_rates(const FaultRates& rates) {
  for (double p : rates.probability) {
    RT_ASSERT(p >= 0.0, "fault rate below 0", p);
    RT_ASSERT(p <= 1.0, "fault rate above 1", p);
  }
}

}  // namespace

std::string_view to_string(FaultKind kind) {
  switch (kind) {
    case FaultKind::short_read:
      return "short_read";
    case FaultKind::read_eio:
      return "read_eio";
    case FaultKind::bit_flip:
      return "bit_flip";
    case FaultKind::write_eio:
      return "write_eio";
    case FaultKind::enospc:
      return "enospc";
    case FaultKind::torn_write:
      return "torn_write";
    case FaultKind::sync_eio:
      return "sync_eio";
  }
  return "unknown";
}

FaultyBlockFile::FaultyBlockFile(std::unique_ptr<BlockFile> inner, uint64_t seed, FaultRates rates)
    : inner_(std::move(inner)), state_(seed), rates_(rates) {
  RT_ASSERT(inner_ != nullptr, "FaultyBlockFile needs a file to wrap");
  check_rates(rates_);
  armed_skip_.fill(disarmed_);
}

void FaultyBlockFile::arm(FaultKind kind, uint32_t skip_calls) {
  armed_skip_[static_cast<size_t>(kind)] = skip_calls;
  RT_ASSERT(armed_skip_[static_cast<size_t>(kind)] >= 0, "arm: negative countdown");
}

void FaultyBlockFile::disarm_all() {
  armed_skip_.fill(disarmed_);
}

void FaultyBlockFile::set_rates(FaultRates rates) {
  check_rates(rates);
  rates_ = rates;
}

uint64_t FaultyBlockFile::injected_total_count() const {
  uint64_t total = 0;
  for (uint64_t n : injected_count_) total += n;
  return total;
}

uint64_t FaultyBlockFile::next_random() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double FaultyBlockFile::next_unit() {
  return static_cast<double>(next_random() >> 11) * (1.0 / 9007199254740992.0);
}

// At most one fault per call among `kinds` (one operation's kinds, in order): a due arm first
// (a later arm due in the same call stays due for the next call), else the seeded rates.
std::optional<FaultKind> FaultyBlockFile::choose(std::initializer_list<FaultKind> kinds) {
  std::optional<FaultKind> chosen;
  for (FaultKind kind : kinds) {
    int64_t& skip = armed_skip_[static_cast<size_t>(kind)];
    if (skip == 0 && !chosen) {
      chosen = kind;
      skip = disarmed_;
    } else if (skip > 0) {
      --skip;
    }
  }
  for (FaultKind kind : kinds) {
    if (chosen) break;
    double p = rates_[kind];
    if (p > 0.0 && next_unit() < p) chosen = kind;
  }
  if (chosen) ++injected_count_[static_cast<size_t>(*chosen)];
  RT_ASSERT(!chosen || armed_skip_[static_cast<size_t>(*chosen)] != 0, "fired arm still due");
  return chosen;
}

size_t FaultyBlockFile::random_prefix_bytes(size_t size_bytes) {
  uint32_t align = inner_->alignment_bytes();
  RT_ASSERT(align > 0, "alignment 0");
  uint64_t units = size_bytes / align;
  size_t keep_bytes = units == 0 ? 0 : static_cast<size_t>(next_random() % units) * align;
  RT_ASSERT(keep_bytes < size_bytes || size_bytes == 0, "a prefix must lose bytes", keep_bytes);
  return keep_bytes;
}

Result<size_t> FaultyBlockFile::pread(std::span<uint8_t> out, uint64_t offset_bytes) {
  auto fault = choose({FaultKind::short_read, FaultKind::read_eio, FaultKind::bit_flip});
  if (fault == FaultKind::short_read) {
    size_t keep_bytes = random_prefix_bytes(out.size());
    if (keep_bytes == 0) return size_t{0};
    return inner_->pread(out.first(keep_bytes), offset_bytes);
  }
  if (fault == FaultKind::read_eio) return injected_error(FaultKind::read_eio, EIO);
  auto n = inner_->pread(out, offset_bytes);
  RT_ASSERT(!n || *n <= out.size(), "inner pread returned more than asked", *n);
  if (!n || *n == 0 || fault != FaultKind::bit_flip) return n;
  RT_ASSERT(fault == FaultKind::bit_flip, "unhandled read fault");
  uint64_t bit = next_random() % (uint64_t{*n} * 8);
  out[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  return n;
}

Result<size_t> FaultyBlockFile::pwrite(std::span<const uint8_t> data, uint64_t offset_bytes) {
  auto fault = choose({FaultKind::write_eio, FaultKind::enospc, FaultKind::torn_write});
  if (fault == FaultKind::write_eio) return injected_error(FaultKind::write_eio, EIO);
  if (fault == FaultKind::enospc) return injected_error(FaultKind::enospc, ENOSPC);
  if (fault != FaultKind::torn_write) return inner_->pwrite(data, offset_bytes);
  size_t keep_bytes = random_prefix_bytes(data.size());
  RT_ASSERT(fault == FaultKind::torn_write, "unhandled write fault");
  if (keep_bytes > 0) {
    auto n = inner_->pwrite(data.first(keep_bytes), offset_bytes);
    if (!n) return n;
  }
  return data.size();  // the lie: the caller believes every byte landed
}

Status FaultyBlockFile::sync_data() {
  if (choose({FaultKind::sync_eio})) return injected_error(FaultKind::sync_eio, EIO);
  return inner_->sync_data();
}

}  // namespace tandem::kv::tier2
