// A BlockFile that wraps another and injects faults: the disk half of the simulation
// adapters (STYLE.md §7: faults live in the adapters, not in global switches).
//
// Faults, each applied to one call:
//   short_read   pread returns a prefix only (the rest of `out` is left as it was);
//   read_eio     pread fails with EIO, nothing read;
//   bit_flip     pread succeeds but one bit of what it returns is flipped;
//   write_eio    pwrite fails with EIO, nothing written;
//   enospc       pwrite fails with ENOSPC, nothing written;
//   torn_write   only a prefix of the bytes lands (possibly none) and pwrite REPORTS SUCCESS:
//                what a crash in the middle of a write, or a lying device, leaves behind;
//   sync_eio     sync_data fails with EIO.
// Two drivers, usable together: arm(kind, skip) makes the (skip+1)-th next call of that kind's
// operation fail once (one-shot, deterministic); a FaultRates schedule makes each call fail
// with a per-kind probability drawn from a seeded generator (same seed, same calls, same
// faults). Armed faults go first. Counts of injected faults are kept per kind.
//
// Same threading as the wrapped file (one owner). Cost: that of the wrapped call, plus one
// generator step per call when rates are set.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>

#include "kvstore/tier2/block_file.hpp"

namespace tandem::kv::tier2 {

enum class FaultKind : uint8_t {
  short_read,
  read_eio,
  bit_flip,
  write_eio,
  enospc,
  torn_write,
  sync_eio,
};
inline constexpr size_t fault_kinds_count = 7;
std::string_view to_string(FaultKind kind);

// Probability per call, in [0, 1], of each fault (indexed by FaultKind). Read faults are
// tried in the order short_read, read_eio, bit_flip; write faults write_eio, enospc,
// torn_write; at most one fault per call.
struct FaultRates {
  std::array<double, fault_kinds_count> probability{};
  double& operator[](FaultKind kind) { return probability[static_cast<size_t>(kind)]; }
  double operator[](FaultKind kind) const { return probability[static_cast<size_t>(kind)]; }
};

class FaultyBlockFile final : public BlockFile {
 public:
  // `inner` is owned. Preconditions (asserted): inner != nullptr, each rate in [0, 1].
  FaultyBlockFile(std::unique_ptr<BlockFile> inner, uint64_t seed, FaultRates rates = {});

  // One-shot: the (skip_calls + 1)-th next call of the kind's operation gets the fault.
  // Re-arming a kind replaces its pending arm.
  void arm(FaultKind kind, uint32_t skip_calls = 0);
  void disarm_all();
  void set_rates(FaultRates rates);  // preconditions as in the constructor

  uint64_t injected_count(FaultKind kind) const {
    return injected_count_[static_cast<size_t>(kind)];
  }
  uint64_t injected_total_count() const;

  Result<size_t> pwrite(std::span<const uint8_t> data, uint64_t offset_bytes) override;
  Result<size_t> pread(std::span<uint8_t> out, uint64_t offset_bytes) override;
  Status sync_data() override;
  uint64_t size_bytes() const override { return inner_->size_bytes(); }
  uint32_t alignment_bytes() const override { return inner_->alignment_bytes(); }
  IoMode io_mode() const override { return inner_->io_mode(); }

 private:
  static constexpr int64_t disarmed_ = -1;
  std::optional<FaultKind> choose(std::initializer_list<FaultKind> kinds);
  size_t random_prefix_bytes(size_t size_bytes);  // a multiple of alignment, < size_bytes
  uint64_t next_random();                         // splitmix64
  double next_unit();                             // in [0, 1)

  std::unique_ptr<BlockFile> inner_;
  uint64_t state_ = 0;
  FaultRates rates_;
  std::array<int64_t, fault_kinds_count> armed_skip_{};  // disarmed_ or calls still to skip
  std::array<uint64_t, fault_kinds_count> injected_count_{};
};

}  // namespace tandem::kv::tier2
