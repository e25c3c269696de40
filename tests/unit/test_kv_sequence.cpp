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
  // Its node went down: out of sync, and a snapshot is asked as soon as it is back.
  seq.resync_sent(t0 + 6s);
  seq.lost();
  CHECK(!seq.synced());
  CHECK(seq.resync_due(t0 + 6s));
}
