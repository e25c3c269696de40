// What every actor shell of a serving role gets from its node: the manifest, the bridge to
// the cluster, a logger and the metrics registry. All outlive the actor.
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/common/exec_watch.hpp"
#include "config/manifest.hpp"
#include "messages/envelope.hpp"
#include "runtime/node/bridge.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/node/supervisor.hpp"
#include "runtime/obs/metrics.hpp"

namespace tandem::actors {

struct ShellContext {
  const config::Manifest* manifest = nullptr;
  runtime::Bridge* bridge = nullptr;
  std::shared_ptr<spdlog::logger> log;
  obs::Registry* metrics = nullptr;
  caf::actor node_actor;  // subscribe here for membership events and peer loads
  // What is down on this node (the supervisor writes it; the gateway's /health reads it).
  std::shared_ptr<const runtime::NodeHealth> node_health;
  // The executor's device is lost for good (runtime::NodeEnv::device_lost); may be empty.
  std::function<void(const std::string& instance, const std::string& reason)> device_lost;
};

// An executor answer said its device is lost for good (ExecResult::device_lost): the first
// time (`watch` takes `reason`), logs it for `role` `self`, lets the shell end what it holds
// (`end_requests`, whose requests `ending` names in the log) and tells the node
// (ShellContext::device_lost). Later answers change nothing.
void lose_device(const ShellContext& ctx, ExecWatch& watch, const messages::ActorName& self,
                 std::string_view role, const std::string& reason, std::string_view ending,
                 const std::function<void()>& end_requests);

// The backstop at a handler's boundary (STYLE section 8: one bad message costs one answer,
// never an actor). Handlers return expected errors as values; anything `body` still throws
// (std::exception, kj::Exception, anything else) is a bug that must cost only this message:
// it is logged at error level as "<role>: <what> failed: <why>", counted in
// tandem:handler_failures_total{role} and returned as Error{failed, "internal error while
// <what>: <why>"} for the caller to answer the message with. The actor lives on.
class HandlerGuard {
 public:
  HandlerGuard(const ShellContext& ctx, std::string role);
  Status run(std::string_view what, const std::function<void()>& body) const;
  // run() for an InboundFrame handler: on failure, a frame that carries a correlation id
  // from an actor (not a node) is answered with an Error for that id, so its sender ends the
  // request instead of waiting for a timeout.
  void run_frame(const messages::ActorName& self_name, const runtime::InboundFrame& in,
                 const std::function<void()>& body) const;
  uint64_t failures_count() const { return failures_->value(); }

 private:
  ShellContext ctx_;
  std::string role_;
  obs::Counter* failures_;
};

// Sends an Error for `request_id` to `to`. Failures to send are logged, not returned.
void send_error(const ShellContext& ctx, const messages::ActorName& from,
                const messages::ActorName& to, uint64_t request_id, const Error& error,
                uint32_t tokens_sent = 0);

// Metric helpers: assert the fixed names/labels are accepted by the registry.
obs::Counter* make_counter(obs::Registry& registry, const std::string& name,
                           const std::string& help, obs::Labels labels);
obs::Gauge* make_gauge(obs::Registry& registry, const std::string& name, const std::string& help,
                       obs::Labels labels);
obs::Histogram* make_histogram(obs::Registry& registry, const std::string& name,
                               const std::string& help, std::vector<double> bounds,
                               obs::Labels labels);

}  // namespace tandem::actors

#include "devices/device.hpp"
#include "devices/kv_segments.hpp"
#include "devices/sampling.hpp"

namespace tandem::actors {

// Samples the token at output `position` of a sequence. The RNG is seeded from
// (params.seed, position), so a token does not depend on which instance samples it: prefill
// sampling the first token and decode sampling the rest give what one instance would.
// `out` is the device's output for the sequence; `row` selects a logits row (decode passes
// with drafts produce several). Sim devices produce tokens instead of logits: such a token
// has logprob 0 and is its own only alternative (top = {token, 0} when logprobs_top_n > 0).
Result<devices::SampledToken> sample_at(const devices::SamplingParams& params, uint32_t position,
                                        const devices::SeqOutput& out, uint32_t row,
                                        std::span<const int32_t> history, uint32_t vocab_size);

std::chrono::nanoseconds now_ns();  // steady clock, for cores that take `now`

}  // namespace tandem::actors

#include "kvstore/prefix_cache.hpp"

namespace tandem::actors {
// Describes one KV block of a registered region for a peer's RMA read: the endpoint
// `address`, the region, the block's offset in it (block * block_bytes; a layer-major pool's
// parts are listed from that block index), its hash (none when null: a partial block), the
// layout of the pool it is in and the block's segments.
void fill_block_descriptor(wire::BlockDescriptor::Builder d, const std::string& address,
                           const runtime::RemoteRegionRef& region, uint64_t offset_bytes,
                           const kv::BlockHash* hash, const devices::KvLayout& layout);
void fill_kv_layout(wire::KvLayout::Builder l, const devices::KvLayout& layout);

// Blocks written into a shell's pool from outside its device (an RMA pull from prefill, a
// tier-2 load) and not yet handed to the executor: the shell's next pass carries them
// (devices::PrefillSeq::imported), so a device whose KV is not the host pool copies them in
// before any pass reads them. Passes reach the executor in the order they are sent, so that
// is before their first use. Bounded: duplicates are dropped once it holds more than the pool.
class ImportedBlocks {
 public:
  void add(uint32_t block, uint32_t blocks_total) {
    blocks_.push_back(block);
    if (blocks_.size() > blocks_total) {
      std::sort(blocks_.begin(), blocks_.end());
      blocks_.erase(std::unique(blocks_.begin(), blocks_.end()), blocks_.end());
    }
  }
  std::vector<uint32_t> take() { return std::exchange(blocks_, {}); }

 private:
  std::vector<uint32_t> blocks_;
};

// Where a described block is, for an RMA read of it (fill_block_descriptor's inverse; the
// hash and layout are the caller's to check).
struct RemoteBlock {
  std::string address;
  runtime::RemoteRegionRef region;
  uint64_t offset_bytes = 0;
  uint64_t length_bytes = 0;
  // The block's layout and segments in the region (devices/kv_segments.hpp), for
  // plan_block_copy: what a reader checks and plans its reads from.
  devices::KvSource source;
};
RemoteBlock read_block_descriptor(wire::BlockDescriptor::Reader d);
// The layout a descriptor or lookup carries (blocks_total unknown: 0). Orders and inner orders
// this build does not know read as an impossible layout (0 layers), which no pool matches.
devices::KvLayout read_kv_layout(wire::KvLayout::Reader l);

// The serving metrics every prefill/decode instance exports (names modelled on vLLM's,
// labelled by instance), refreshed from its scheduler counts and its prefix cache.
class InstanceMetrics {
 public:
  InstanceMetrics(obs::Registry& registry, const std::string& instance);
  void refresh(const kv::PrefixCache& cache, uint32_t waiting, uint32_t running);
  obs::Registry& registry() { return registry_; }
  const obs::Labels& labels() const { return labels_; }

 private:
  obs::Registry& registry_;
  obs::Labels labels_;
  obs::Gauge* waiting_;
  obs::Gauge* running_;
  obs::Gauge* kv_usage_;
  obs::Counter* queries_tokens_;
  obs::Counter* hits_tokens_;
  obs::Gauge* cached_blocks_;
  obs::Gauge* cached_entries_;
  uint64_t queries_seen_ = 0, hits_seen_ = 0;
};

// Tells every router of the cluster what this instance's prefix cache holds: numbered frames
// of stored (with parents) and removed blocks, so a router in precise mode ([router] kv_index)
// keeps an exact index of it, and one in approximate mode stops counting evicted blocks
// (it records stored ones from its own picks). A router that misses a frame or restarts asks
// for a snapshot (KvResync). `tandem sim` applies the same events.
class KvEventReporter {
 public:
  KvEventReporter(const ShellContext& ctx, messages::ActorName self);
  // Tier 1 (prefill, decode): precise events of the instance's prefix cache. Drains the
  // cache's events and sends them to every router as numbered frames (1, 2, ... in this
  // process) that fit the manifest's frame_bytes_max: removals, then stored blocks in chain
  // order with their parents. The first flush, and the first after request_snapshot(), sends
  // a snapshot instead (allCleared, then everything cached). With nothing to send for half of
  // router.kv_resync_interval_ms it sends a keepalive (unnumbered, naming the last frame),
  // so a router that lost the last frame finds out. Call it after each change and on a tick.
  void flush(kv::PrefixCache& cache);
  void request_snapshot() { snapshot_due_ = true; }  // a router asked (KvResync)
  uint64_t removed_count() const { return removed_count_; }  // hashes drained as removed
  uint64_t stored_count() const { return stored_count_; }    // ... as stored (snapshots too)

  // Precise tier-2 events (kv-offload): numbered frames (1, 2, ... in this process) to every
  // router, stored and removed in separate frames, in that order. snapshot: the first frame
  // says allCleared (the list that follows is all this source holds). A frame a router does
  // not get is a gap it detects (actors/router/kv_sequence.hpp) and answers with KvResync.
  void send_tier2(std::span<const kv::BlockHash> stored, std::span<const kv::BlockHash> removed,
                  bool snapshot);
  // An empty, unnumbered frame naming the last one sent: a router that missed it finds out.
  void send_tier2_keepalive();
  uint64_t sequence() const { return sequence_; }

 private:
  // One frame to every router. parents: empty, or parallel to stored (tier 1).
  void send_frame(uint8_t tier, bool all_cleared, uint64_t sequence,
                  std::span<const kv::BlockHash> stored,
                  std::span<const std::optional<kv::BlockHash>> parents,
                  std::span<const kv::BlockHash> removed);
  void send_device(const kv::CacheEvents& events, bool snapshot);

  ShellContext ctx_;
  messages::ActorName self_;
  std::vector<messages::ActorName> routers_;
  size_t hashes_per_frame_ = 0;
  uint64_t removed_count_ = 0;
  uint64_t stored_count_ = 0;
  uint64_t sequence_ = 0;
  bool snapshot_due_ = true;  // the first flush tells the routers where this source starts
  std::chrono::steady_clock::time_point sent_at_{};  // the last frame (keepalive cadence)
};

// Whether a prefill instance's tier-2 cost rule reads from its node's / another node's tier 2
// (the router credits tier-2 copies only where they would be read). Decode: both (unused).
struct Tier2Reads {
  bool local = true;
  bool remote = true;
};
// Prefill's extras in its load report.
struct PrefillLoadExtras {
  Tier2Reads tier2;
  std::optional<uint64_t> pending_tokens;  // PrefillScheduler::pending_tokens
};

// Sends this instance's load to its node actor, which carries it in heartbeats to the router.
void report_load(caf::event_based_actor* self, const ShellContext& ctx,
                 const messages::ActorName& name, const kv::PrefixCache& cache, uint32_t waiting,
                 uint32_t running, PrefillLoadExtras extras = {});

// Reports that this instance cannot serve (no device yet, or its executor failed), with
// the reason the gateway shows in /health. Sent every tick while not ready, like report_load.
void report_not_ready(caf::event_based_actor* self, const ShellContext& ctx,
                      const messages::ActorName& name, const std::string& reason);

// How often prefill and decode shells tick: load reports, hold and prefill timeouts.
inline constexpr std::chrono::milliseconds shell_tick_interval{100};

// The tick of a prefill or decode shell whose executor failed to create its device: reports
// not-ready with the executor's error (router and gateway skip the instance) and schedules
// the next tick. The actor's state has `ctx`, `self_name` and `info` (ExecInfo).
template <class ShellActor>
void not_ready_tick(ShellActor* self) {
  auto& st = self->state;
  report_not_ready(self, st.ctx, st.self_name, "executor failed: " + st.info.error);
  self->delayed_send(self, shell_tick_interval, runtime::atoms::tick::value);
}

}  // namespace tandem::actors
