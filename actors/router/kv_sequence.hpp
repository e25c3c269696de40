// Precise KV events (issue 13): the receiving side's check of one source's event stream.
// A source (a kv-offload instance today) numbers its KvEvents frames 1, 2, 3, ... within its
// incarnation (its process); a frame with allCleared starts its view over (a snapshot: the
// frames that follow list what it holds, then its changes). The receiver applies a frame only
// when it continues the stream it has applied so far; a gap (a frame refused or lost on the
// way), another incarnation (the source restarted) or a stream never synced (this router
// started after the source) makes the receiver drop the source's view and ask the source for
// a snapshot (KvResync), at most once per resync_interval while it is out of sync. A loss
// is seen when the next frame arrives, so an idle source sends a keepalive now and then (a
// frame with nothing in it, not numbered: it carries the number of the source's last frame),
// which finds a lost last frame.
// Pure: time is passed in. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace tandem::router {

class KvSequence {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Verdict {
    apply,        // the next frame of a synced stream
    reset_apply,  // a snapshot's first frame: clear the source's view, then apply
    drop,         // out of sync: ignore it (resync_due says when to ask for a snapshot)
    drop_lost,    // it broke a synced stream: clear the source's view, ignore the frame
  };
  explicit KvSequence(std::chrono::milliseconds resync_interval)
      : resync_interval_(resync_interval) {}

  // keepalive: `sequence` is the source's last frame, not a new one (nothing to apply).
  Verdict on_frame(uint64_t incarnation, uint64_t sequence, bool all_cleared,
                   bool keepalive = false);
  // Whether to send a KvResync now (out of sync and none asked within resync_interval).
  bool resync_due(Clock::time_point now) const;
  void resync_sent(Clock::time_point now) { asked_at_ = now; }
  // The source is gone (its node down): out of sync, and ask again as soon as it returns.
  void lost();

  bool synced() const { return synced_; }
  uint64_t gaps_count() const { return gaps_count_; }
  uint64_t snapshots_count() const { return snapshots_count_; }

 private:
  std::chrono::milliseconds resync_interval_;
  bool synced_ = false;
  uint64_t incarnation_ = 0;
  uint64_t sequence_ = 0;
  std::optional<Clock::time_point> asked_at_;
  uint64_t gaps_count_ = 0;
  uint64_t snapshots_count_ = 0;
};

}  // namespace tandem::router
