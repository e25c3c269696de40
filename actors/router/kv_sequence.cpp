#include "actors/router/kv_sequence.hpp"

#include "runtime/base/assert.hpp"

namespace tandem::router {

KvSequence::Verdict KvSequence::on_frame(uint64_t incarnation, uint64_t sequence,
                                         bool all_cleared, bool keepalive) {
  if (keepalive && !all_cleared) {
    if (!synced_) return Verdict::drop;
    if (incarnation == incarnation_ && sequence == sequence_) return Verdict::apply;
    synced_ = false;  // its last frame, or a restart, never reached this receiver
    asked_at_.reset();
    ++gaps_count_;
    return Verdict::drop_lost;
  }
  if (all_cleared) {
    synced_ = true;
    incarnation_ = incarnation;
    sequence_ = sequence;
    asked_at_.reset();
    ++snapshots_count_;
    return Verdict::reset_apply;
  }
  if (synced_ && incarnation == incarnation_ && sequence == sequence_ + 1) {
    sequence_ = sequence;
    return Verdict::apply;
  }
  if (!synced_) return Verdict::drop;
  // A gap, a repeat or another incarnation: what this receiver holds for the source can no
  // longer be trusted.
  synced_ = false;
  asked_at_.reset();
  ++gaps_count_;
  RT_ASSERT(!synced_);
  return Verdict::drop_lost;
}

bool KvSequence::resync_due(Clock::time_point now) const {
  if (synced_) return false;
  return !asked_at_ || now - *asked_at_ >= resync_interval_;
}

void KvSequence::lost() {
  synced_ = false;
  asked_at_.reset();
}

}  // namespace tandem::router
