// Precise KV events: the receiver's check of a source's numbered frames (router/kv_sequence).
#include <doctest.h>

#include "actors/router/kv_sequence.hpp"

using tandem::router::KvSequence;
using namespace std::chrono_literals;
using V = KvSequence::Verdict;

TEST_CASE("kv sequence: a stream applies in order; a gap or a restart asks for a snapshot") {
  KvSequence seq(1000ms);
  auto t0 = KvSequence::Clock::time_point{} + 10s;
  // Never synced: deltas are dropped and a snapshot is due at once, then not again for 1 s.
  CHECK(!seq.synced());
  CHECK(seq.on_frame(7, 5, false) == V::drop);
  CHECK(seq.resync_due(t0));
  seq.resync_sent(t0);
  CHECK(!seq.resync_due(t0 + 999ms));
  CHECK(seq.resync_due(t0 + 1000ms));
  // The snapshot starts the stream; what follows applies while it is consecutive.
  CHECK(seq.on_frame(7, 6, true) == V::reset_apply);
  CHECK(seq.synced());
  CHECK(!seq.resync_due(t0 + 5s));
  CHECK(seq.on_frame(7, 7, false) == V::apply);
  CHECK(seq.on_frame(7, 8, false) == V::apply);
  // A lost frame (9): the view is dropped, later frames too, until the next snapshot.
  CHECK(seq.on_frame(7, 10, false) == V::drop_lost);
  CHECK(seq.gaps_count() == 1);
  CHECK(!seq.synced());
  CHECK(seq.resync_due(t0 + 5s));
  CHECK(seq.on_frame(7, 11, false) == V::drop);
  CHECK(seq.on_frame(7, 12, true) == V::reset_apply);
  CHECK(seq.on_frame(7, 13, false) == V::apply);
  // A repeated frame breaks the stream too (it cannot be told from a reordering).
  CHECK(seq.on_frame(7, 13, false) == V::drop_lost);
  CHECK(seq.on_frame(7, 14, true) == V::reset_apply);
  // The source restarted (another incarnation, numbering from 1 again).
  CHECK(seq.on_frame(8, 1, false) == V::drop_lost);
  CHECK(seq.gaps_count() == 3);
  CHECK(seq.on_frame(8, 1, true) == V::reset_apply);
  CHECK(seq.on_frame(8, 2, false) == V::apply);
  CHECK(seq.snapshots_count() == 4);
  // A keepalive names the last frame: it matches (nothing to apply), or reveals a lost one.
  CHECK(seq.on_frame(8, 2, false, true) == V::apply);
  CHECK(seq.synced());
  CHECK(seq.on_frame(8, 3, false, true) == V::drop_lost);  // frame 3 never arrived
  CHECK(seq.gaps_count() == 4);
  CHECK(seq.on_frame(8, 3, false, true) == V::drop);  // out of sync: ignored
  CHECK(seq.on_frame(8, 4, true) == V::reset_apply);
  // Its node went down: out of sync, and a snapshot is asked as soon as it is back.
  seq.resync_sent(t0 + 6s);
  seq.lost();
  CHECK(!seq.synced());
  CHECK(seq.resync_due(t0 + 6s));
}

#include <cstring>
#include <deque>
#include <random>
#include <set>
#include <vector>

#include "actors/router/tier2_index.hpp"

namespace {

using tandem::kv::BlockHash;

BlockHash hash_of(uint64_t n) {
  BlockHash h;
  for (size_t b = 0; b < 4; ++b) {
    uint64_t part = (n + 1) * 0x9e3779b97f4a7c15ull ^ (b * 0xbf58476d1ce4e5b9ull);
    std::memcpy(h.bytes.data() + 8 * b, &part, 8);
  }
  return h;
}

// One KvEvents frame as the wire carries it (kv-offload's KvEventReporter::send_tier2).
struct Frame {
  uint64_t incarnation, sequence;
  bool all_cleared;
  std::vector<BlockHash> stored, removed;
  bool keepalive = false;
};

}  // namespace

TEST_CASE("kv sequence: over a lossy channel with source restarts, the router's tier-2 view "
          "ends equal to the store's") {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    auto chance = [&](double p) { return std::uniform_real_distribution<>(0, 1)(rng) < p; };
    // The source: a store of at most 64 blocks, numbered frames, snapshots on open and ask.
    std::set<uint64_t> held;
    uint64_t next_block = 0, incarnation = 1, sequence = 0;
    std::deque<Frame> channel;  // FIFO, like one fabric connection
    double loss = 0.1;
    auto send = [&](Frame f) {
      if (!chance(loss)) channel.push_back(std::move(f));
    };
    auto snapshot = [&] {
      std::vector<BlockHash> all;
      for (uint64_t b : held) all.push_back(hash_of(b));
      // In frames of at most 16 hashes; the first says allCleared.
      size_t at = 0;
      do {
        size_t n = std::min<size_t>(16, all.size() - at);
        send({incarnation, ++sequence, at == 0, {all.begin() + at, all.begin() + at + n}, {}});
        at += n;
      } while (at < all.size());
    };
    // The router.
    KvSequence receiver(1000ms);
    tandem::router::Tier2Index index(1000);
    bool ask_in_flight_lost = false;
    auto now = KvSequence::Clock::time_point{} + 1s;
    snapshot();  // the store opened
    for (int step = 0; step < 400; ++step) {
      if (step == 300) loss = 0.0;  // then a quiet channel: the view must converge
      // The source changes.
      if (chance(0.05) && step < 300) {
        ++incarnation;  // restarted: durable blocks kept, numbering from 1, snapshot at open
        sequence = 0;
        snapshot();
      } else if (chance(0.6)) {
        std::vector<BlockHash> stored, removed;
        for (int k = std::uniform_int_distribution<>(1, 6)(rng); k > 0; --k) {
          if (held.size() >= 64) {  // evict the oldest
            removed.push_back(hash_of(*held.begin()));
            held.erase(held.begin());
          }
          held.insert(next_block);
          stored.push_back(hash_of(next_block++));
        }
        if (!stored.empty()) send({incarnation, ++sequence, false, stored, {}});
        if (!removed.empty()) send({incarnation, ++sequence, false, {}, removed});
      }
      send({incarnation, sequence, false, {}, {}, true});  // its keepalive
      // The router reads what arrived, then asks for a snapshot when due.
      bool confirmed = false;  // the last frame read was a keepalive that matched
      while (!channel.empty()) {
        Frame f = std::move(channel.front());
        channel.pop_front();
        auto v = receiver.on_frame(f.incarnation, f.sequence, f.all_cleared, f.keepalive);
        if (v == V::reset_apply || v == V::drop_lost) index.clear(0);
        if (v == V::apply || v == V::reset_apply) {
          CHECK(index.stored(0, f.stored) == 0);
          index.removed(0, f.removed);
        }
        confirmed = f.keepalive && v == V::apply;
      }
      if (receiver.resync_due(now)) {
        receiver.resync_sent(now);
        ask_in_flight_lost = chance(loss);  // the KvResync itself may be lost
        if (!ask_in_flight_lost) snapshot();
      }
      // Confirmed by a keepalive, the view is exact.
      if (confirmed) {
        REQUIRE(index.blocks_count(0) == held.size());
        for (uint64_t b : held) REQUIRE(index.holds(0, hash_of(b)));
      }
      now += 100ms;
    }
    CHECK(receiver.synced());
    CHECK(index.blocks_count(0) == held.size());
    CHECK(receiver.gaps_count() > 0);  // the run did lose frames and recover
  }
}
