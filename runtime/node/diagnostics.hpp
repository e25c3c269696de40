// Fabric diagnostics a node runs on an operator's request (through the admin shell):
//   ping TARGET            round trip from this node to any actor, in microseconds
//   rma-expose BYTES       register a patterned region others may read; answers its descriptor
//   rma-read NODE BASE LEN KEY   one-sided read of a peer's exposed region; answers checksum
//                          and bandwidth
//   rma-release KEY        unregister an exposed region
// State lives in the node actor; replies go out when the async work completes, so the
// node actor never blocks. Bounds: pings_pending_max, regions_max, region_bytes_total_max.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "messages/envelope.hpp"
#include "runtime/fabric/endpoint.hpp"

namespace tandem::runtime {

class Bridge;

struct AdminCaller {
  messages::ActorName who;
  uint64_t correlation = 0;
};

struct AdminResult {
  bool ok = true;
  std::string text;
  std::vector<std::vector<std::string>> rows;
};

// An admin command the node actor hands to each of its local actors of one role (`tier2`,
// `tier2-verify`, `tier2-drop` go to the kv-offload instances): the actor answers an
// AdminResult whose rows start with a header row, within `timeout` (the node actor's wait;
// the actor's own waits must end sooner). The node actor merges the answers into one reply.
struct LocalAdmin {
  std::string command;
  std::vector<std::string> args;
  std::chrono::milliseconds timeout{0};
};

// How long the node actor waits for a forwarded command's answers: one that reads memory
// only (`tier2`), and one that waits on a disk (`tier2-verify` reads every stored block).
// A client waits longer than these: it then gets the node's "no answer" instead of nothing.
inline constexpr std::chrono::milliseconds admin_forward_timeout{3000};
inline constexpr std::chrono::milliseconds admin_disk_timeout{600000};

// Completion of an RMA read started by Diagnostics, delivered to the node actor.
struct RmaReadDone {
  uint64_t token = 0;
  bool ok = false;
  std::string error;
};

// 64-bit checksum of a byte range (FNV-1a over 8-byte words, then the tail). Both ends of
// an RMA test compute it; equal checksums mean equal bytes with overwhelming probability.
uint64_t checksum64(const std::byte* data, uint64_t length_bytes);
// Fills `data` with a xorshift stream seeded by `seed`.
void fill_pattern(std::byte* data, uint64_t length_bytes, uint64_t seed);

class Diagnostics {
 public:
  using Reply = std::function<void(const AdminCaller&, const AdminResult&)>;
  // Posts RmaReadDone to the owning actor (thread-safe; called on the fabric thread).
  using PostReadDone = std::function<void(RmaReadDone)>;

  static constexpr size_t pings_pending_max = 1024;
  static constexpr size_t regions_max = 8;
  static constexpr uint64_t region_bytes_total_max = 2ull << 30;

  Diagnostics(Bridge* bridge, Reply reply, PostReadDone post);
  ~Diagnostics();

  // Each either answers now (bad arguments) or later.
  void ping(const AdminCaller& caller, const std::vector<std::string>& args);
  void on_pong(uint64_t correlation);
  void expire(std::chrono::steady_clock::time_point now);  // times out old pings
  void rma_expose(const AdminCaller& caller, const std::vector<std::string>& args);
  void rma_read(const AdminCaller& caller, const std::vector<std::string>& args);
  void rma_release(const AdminCaller& caller, const std::vector<std::string>& args);
  void on_read_done(const RmaReadDone& done);

 private:
  struct Region {
    std::vector<std::byte> bytes;
    std::unique_ptr<MemoryRegion> registration;
  };
  struct PendingPing {
    AdminCaller caller;
    std::string target;
    std::chrono::steady_clock::time_point start;
  };
  struct PendingRead {
    AdminCaller caller;
    Region region;
    std::chrono::steady_clock::time_point start;
  };

  Bridge* bridge_;
  Reply reply_;
  PostReadDone post_;
  uint64_t next_token_ = 1;
  std::map<uint64_t, PendingPing> pings_;
  std::map<uint64_t, Region> exposed_;      // by memory key
  std::map<uint64_t, PendingRead> reads_;   // by token
  uint64_t region_bytes_total_ = 0;
};

}  // namespace tandem::runtime
