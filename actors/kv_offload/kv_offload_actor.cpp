#include "actors/kv_offload/kv_offload_actor.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <filesystem>

#include "actors/kv_offload/offload_core.hpp"
#include "actors/kv_offload/tier2_report.hpp"
#include "actors/prefill/tier2_policy.hpp"  // ewma (header-only, pure)
#include "kvstore/tier2/tier2_store.hpp"
#include "messages/convert.hpp"
#include "runtime/node/node_actor.hpp"
#include "runtime/node/spawn.hpp"

namespace tandem::actors::offload_io {

// Registered host memory of `slots` slots, each slot_bytes (a block rounded up to 4096, so
// the store writes and reads a slot with O_DIRECT in place). Shared by the shell (RMA) and
// its I/O actor (disk); a slot is touched by the one the core says owns it.
struct Staging {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> memory;
  uint64_t slot_bytes = 0;
  uint64_t block_bytes = 0;
  uint32_t slots = 0;
  std::unique_ptr<runtime::MemoryRegion> region;  // before memory is freed (declared after)
  std::span<uint8_t> slot(kv_offload::Slot s, uint64_t length) const {
    RT_ASSERT(s < slots && length <= slot_bytes, s, length);
    return {reinterpret_cast<uint8_t*>(memory.get()) + uint64_t{s} * slot_bytes, length};
  }
  ~Staging() { region.reset(); }
};

struct Open {
  kv::tier2::Tier2Config config;
};
struct Opened {
  std::string error;  // "" when open
  std::vector<kv::BlockHash> held;
  kv::tier2::Tier2Stats stats;
  std::string io_mode;
};
struct Write {
  std::vector<kv_offload::StoreWrite> writes;
};
struct Read {
  std::vector<kv_offload::LookupGrant> grants;
  std::vector<kv::BlockHash> hashes;  // by grant
};
// What tier 2 gained and lost since the last answer, for the router's precise events:
// disjoint, and each as the store is now (a block evicted and stored again in between is in
// `stored` only). overflowed: more removals than the store keeps; send a snapshot instead.
struct Changes {
  std::vector<kv::BlockHash> stored;
  std::vector<kv::BlockHash> removed;
  bool overflowed = false;
};
struct IoDone {  // one result per write or read, in order
  std::vector<bool> ok;
  std::vector<double> read_seconds;  // reads: how long each took (host cache or disk + check)
  std::vector<bool> from_disk;       // reads: served by the disk (not the host cache), ok
  kv::tier2::Tier2Stats stats;
  std::vector<std::string> events;  // the store's noteworthy events since the last answer
  Changes changes;
};
struct Held {};  // -> HeldList: what the store holds now (a snapshot for the router)
struct HeldList {
  std::vector<kv::BlockHash> blocks;
};
struct Verify {};     // the operator's `tier2 verify`: Tier2Store::verify()
struct DropAll {};    // the operator's `tier2 drop`: Tier2Store::drop_all()
struct Maintained {   // the answer to either
  std::string error;  // "" when done (drop_all can fail; verify cannot)
  kv::tier2::VerifyReport verified;
  kv::tier2::DropReport dropped;
  std::vector<kv::BlockHash> removed;  // own blocks the store no longer holds (all of them)
  kv::tier2::Tier2Stats stats;
  std::vector<std::string> events;
  Changes changes;  // for the routers (its removals may overflow; `removed` never does)
  std::chrono::nanoseconds took{0};
};
struct StoreRmaDone {
  kv_offload::RequestKey key;
  kv_offload::Slot slot = 0;
  bool ok = false;
  std::string error;
};

}  // namespace tandem::actors::offload_io

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::Open)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::Opened)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::Write)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::Read)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::IoDone)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::Held)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::HeldList)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::Verify)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::DropAll)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::Maintained)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::offload_io::StoreRmaDone)

namespace tandem::actors {
namespace {

using messages::ActorName;
using namespace offload_io;
using kv_offload::RequestKey;

// --- The I/O actor: owns the store; every call blocks on the disk (it runs detached). ---

struct IoState {
  std::unique_ptr<kv::tier2::Tier2Store> store;
  std::shared_ptr<Staging> staging;
  static inline const char* name = "tandem.kv-offload.io";
};
using IoActor = caf::stateful_actor<IoState>;

std::vector<std::string> drain(kv::tier2::Tier2Store& store) {
  std::vector<std::string> out;
  for (auto& e : store.drain_events()) {
    out.push_back(std::string(kv::tier2::to_string(e.kind)) + ": " + e.detail);
  }
  return out;
}

// The store's removals since the last call plus `stored` (blocks put), as the store is now.
Changes changes_of(kv::tier2::Tier2Store& store, std::vector<kv::BlockHash> stored) {
  Changes c;
  c.removed = store.drain_removed(&c.overflowed);
  std::erase_if(c.removed, [&](const kv::BlockHash& h) { return store.contains(h); });
  std::erase_if(stored, [&](const kv::BlockHash& h) { return !store.contains(h); });
  c.stored = std::move(stored);
  return c;
}

// Verify or drop_all, timed; `removed` lists the own blocks it took out (for the core).
Maintained maintain(kv::tier2::Tier2Store& store, bool drop) {
  auto start = std::chrono::steady_clock::now();
  std::vector<kv::BlockHash> before = store.blocks();
  Maintained m;
  if (drop) {
    auto dropped = store.drop_all();
    if (dropped.ok()) m.dropped = *dropped;
    if (!dropped.ok()) m.error = dropped.error().describe();
  } else {
    m.verified = store.verify();
  }
  for (const auto& h : before) {
    if (!store.contains(h)) m.removed.push_back(h);
  }
  m.took = std::chrono::steady_clock::now() - start;
  m.stats = store.stats();
  m.events = drain(store);
  m.changes = changes_of(store, {});
  return m;
}

caf::behavior io_behavior(IoActor* self, std::shared_ptr<Staging> staging) {
  self->state.staging = std::move(staging);
  return {
      [self](Open& open) -> Opened {
        auto store = kv::tier2::Tier2Store::open(open.config);
        if (!store.ok()) return Opened{store.error().describe(), {}, {}, ""};
        self->state.store = std::move(store).value();
        auto& s = *self->state.store;
        bool overflowed = false;
        (void)s.drain_removed(&overflowed);  // what opening dropped: the snapshot says the rest
        return Opened{"", s.blocks(), s.stats(), std::string(kv::tier2::to_string(s.io_mode()))};
      },
      [self](Held) -> HeldList {
        auto& st = self->state;
        if (st.store == nullptr) return HeldList{};
        bool overflowed = false;
        (void)st.store->drain_removed(&overflowed);  // the snapshot supersedes them
        return HeldList{st.store->blocks()};
      },
      [self](const Write& w) -> IoDone {
        auto& st = self->state;
        IoDone done;
        RT_ASSERT(st.store != nullptr, "writes only after the store opened");
        // A prompt's blocks arrive together: one group commit (one fdatasync and one synced
        // index batch) per puts_batch_max of them, not two device flushes per block.
        size_t batch_max = st.store->config().puts_batch_max;
        std::vector<kv::BlockHash> stored;
        for (size_t at = 0; at < w.writes.size(); at += batch_max) {
          std::vector<kv::tier2::PutItem> items;
          for (size_t i = at; i < std::min(w.writes.size(), at + batch_max); ++i) {
            const auto& item = w.writes[i];
            items.push_back({item.hash, st.staging->slot(item.slot, st.staging->block_bytes)});
          }
          auto puts = st.store->put_batch(items);
          for (size_t i = 0; i < puts.size(); ++i) {
            done.ok.push_back(puts[i].ok());
            if (puts[i].ok()) stored.push_back(items[i].hash);
          }
        }
        done.stats = st.store->stats();
        done.events = drain(*st.store);
        done.changes = changes_of(*st.store, std::move(stored));
        return done;
      },
      [self](const Read& r) -> IoDone {
        auto& st = self->state;
        IoDone done;
        RT_ASSERT(st.store != nullptr && r.grants.size() == r.hashes.size(), r.grants.size());
        for (size_t i = 0; i < r.grants.size(); ++i) {
          auto start = std::chrono::steady_clock::now();
          uint64_t cache_hits = st.store->stats().cache_hits_count;
          auto got = st.store->get(r.hashes[i],
                                   st.staging->slot(r.grants[i].slot, st.staging->slot_bytes));
          done.ok.push_back(got.ok() && *got == st.staging->block_bytes);
          done.from_disk.push_back(done.ok.back() &&
                                   st.store->stats().cache_hits_count == cache_hits);
          done.read_seconds.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        done.stats = st.store->stats();
        done.events = drain(*st.store);
        done.changes = changes_of(*st.store, {});
        return done;
      },
      [self](const Verify&) -> Maintained {
        RT_ASSERT(self->state.store != nullptr, "verify only after the store opened");
        return maintain(*self->state.store, false);
      },
      [self](const DropAll&) -> Maintained {
        RT_ASSERT(self->state.store != nullptr, "drop only after the store opened");
        return maintain(*self->state.store, true);
      },
  };
}

// --- The shell ---

struct Offer {  // one OffloadStore block: what it is and where to read it from
  kv::BlockHash hash;
  RemoteBlock at;
};

struct Tier2Metrics {
  explicit Tier2Metrics(obs::Registry& r, const std::string& instance) {
    obs::Labels l = {{"instance", instance}};
    auto c = [&](const char* name, const char* help) { return make_counter(r, name, help, l); };
    auto g = [&](const char* name, const char* help) { return make_gauge(r, name, help, l); };
    hit_blocks = c("tandem:tier2_hit_blocks_total", "blocks a lookup found and staged");
    partial_blocks = c("tandem:tier2_partial_hit_blocks_total",
                       "of those, partial blocks: a prompt's sub-block prefix of a block "
                       "(sub_block_tokens below block_tokens)");
    miss_blocks = c("tandem:tier2_miss_blocks_total",
                    "blocks believed stored whose read missed (corrupt, I/O error, evicted)");
    lookups = c("tandem:tier2_lookups_total", "lookups asked");
    stored_blocks = c("tandem:tier2_stored_blocks_total", "blocks written, durable and indexed");
    dropped_blocks = c("tandem:tier2_store_dropped_blocks_total",
                       "offered blocks not stored: no staging slot, too many offers, a failed "
                       "read or write");
    read_bytes = c("tandem:tier2_read_bytes_total", "bytes read from the data file");
    written_bytes = c("tandem:tier2_written_bytes_total", "bytes written to the data file");
    corrupt = c("tandem:tier2_corrupt_blocks_dropped_total",
                "entries dropped because their bytes failed the checksum or length check");
    over_budget = c("tandem:tier2_lookup_over_budget_blocks_total",
                    "asked blocks not staged: behind the disk's queue they would have been read "
                    "later than the asker could compute them (OffloadLookup.budgetNs)");
    used = g("tandem:tier2_blocks_used", "blocks tier 2 holds");
    capacity = g("tandem:tier2_blocks_capacity", "blocks tier 2 can hold");
    read_seconds = make_histogram(r, "tandem:tier2_read_seconds",
                                  "seconds one block's read took (host cache, or disk read and "
                                  "checksum; misses too)",
                                  obs::exponential_buckets(1e-5, 2.0, 18), l);
  }
  kv_offload::Tier2Counts counts() const {
    return {lookups->value(),       hit_blocks->value(),     miss_blocks->value(),
            stored_blocks->value(), dropped_blocks->value(), corrupt->value(),
            read_bytes->value(),    written_bytes->value()};
  }
  obs::Counter *hit_blocks, *miss_blocks, *lookups, *stored_blocks, *dropped_blocks, *read_bytes,
      *written_bytes, *corrupt, *over_budget, *partial_blocks;
  obs::Gauge *used, *capacity;
  obs::Histogram* read_seconds;
  kv::tier2::Tier2Stats seen;  // the store's counters already added
};

constexpr int64_t open_retry_min_ns = 5'000'000'000;   // a failed open, tried again after
constexpr int64_t open_retry_max_ns = 60'000'000'000;  // ... doubling up to

struct OffloadState {
  ShellContext ctx;
  ActorName self_name;
  std::optional<HandlerGuard> guard;
  std::optional<kv_offload::OffloadCore> core;
  caf::actor io;
  std::shared_ptr<Staging> staging;
  enum class Phase { closed, opening, open, failed } phase = Phase::closed;
  std::string failure;        // why tier 2 is off (Phase::failed)
  // A store that failed to open (a full disk, say) is opened again at the next block offered
  // from this time on (now_ns), backing off from open_retry_min to open_retry_max; nullopt
  // when it failed for a reason a retry cannot mend (a disk that stopped answering).
  std::optional<int64_t> retry_open_after_ns;
  int64_t open_retry_ns = 0;
  std::string fingerprint;    // of the layout the store opened with
  devices::KvLayout layout;   // of the store's blocks (blocks_total unused)
  std::deque<runtime::InboundFrame> waiting;  // frames that arrived while the store opened
  struct Offered {
    ActorName from;
    std::chrono::nanoseconds received{0};
  };
  // Store offers whose RMA reads are in flight (<= kv_offload.stores_max, the core's bound).
  std::map<RequestKey, Offered> store_reply_to;
  std::unique_ptr<Tier2Metrics> metrics;
  // Precise tier-2 events to the routers: numbered frames; a snapshot (allCleared + what the
  // store holds) at open and whenever a router asks (KvResync), one in flight at a time.
  std::optional<KvEventReporter> events;
  bool snapshot_pending = false;
  std::chrono::nanoseconds keepalive_sent{0};  // every router.kv_resync_interval_ms / 2
  kv::tier2::Tier2Stats stats;                 // the store's, as of its latest answer
  std::string io_mode;                         // of the open store
  std::string maintenance;  // "verify" or "drop" while one runs (one at a time), else ""
  kv_offload::RateWindow rates{std::chrono::seconds(5)};  // `tier2`'s per-second rates
  // The disk's queue, for lookup budgets: bytes sent to the I/O actor not answered yet, and
  // the measured read rate (bytes over each verified disk read's own time; host cache hits
  // left out).
  uint64_t io_queued_bytes = 0;
  double read_bytes_per_s = 0;
  static inline const char* name = "tandem.kv-offload";
};
using OffloadActor = caf::stateful_actor<OffloadState>;

constexpr auto io_timeout = std::chrono::seconds(120);

kv_offload::OffloadConfig core_config(const config::Manifest& m, uint64_t slots_count) {
  kv_offload::OffloadConfig c;
  c.staging_blocks = m.kv_offload.staging_blocks;
  c.stores_max = m.kv_offload.stores_max;
  c.lookups_max = m.kv_offload.lookups_max;
  c.lookup_blocks_max = std::min(m.kv_offload.staging_blocks, m.kv_offload.lookup_blocks_max);
  c.known_blocks_max = std::max<uint64_t>(1, slots_count);
  c.hold_timeout = std::chrono::milliseconds(m.kv_offload.hold_timeout_ms);
  return c;
}

// Tier 2 keeps blocks of whole-model, block-major pools: one run per block, read and written
// whole. A pipeline stage's slice or a per-layer cache is not stored (its asks find nothing).
bool tier2_layout(const devices::KvLayout& l) {
  return l.layers > 0 && l.order == devices::KvOrder::block_major && l.layer_first == 0;
}

std::string fingerprint_of(const config::Manifest& m, const devices::KvLayout& l) {
  kv::tier2::KvLayout f;
  f.model = m.model.name;
  f.dtype = "bytes" + std::to_string(l.element_bytes);
  f.block_tokens = l.block_tokens;
  f.layers_count = l.layers;
  f.kv_heads_count = l.kv_heads;
  f.head_dim = l.head_dim;
  // Another element order inside a part is other bytes (kept out of the key for the original
  // order, so stores written before it still open).
  if (l.inner != devices::KvInner::slot_head_dim) f.dtype += "-" + std::string(to_string(l.inner));
  return kv::tier2::make_fingerprint(f);
}

void add_stats(OffloadState& st, const kv::tier2::Tier2Stats& s) {
  st.stats = s;
  auto& m = *st.metrics;
  auto delta = [](uint64_t now, uint64_t& seen) {
    uint64_t d = now >= seen ? now - seen : 0;
    seen = now;
    return d;
  };
  m.read_bytes->inc(delta(s.read_bytes, m.seen.read_bytes));
  m.written_bytes->inc(delta(s.written_bytes, m.seen.written_bytes));
  m.corrupt->inc(delta(s.corrupt_dropped_count, m.seen.corrupt_dropped_count));
  m.used->set(static_cast<double>(s.blocks_used_count));
  m.capacity->set(static_cast<double>(s.blocks_capacity_count));
}

void log_events(OffloadState& st, const std::vector<std::string>& events) {
  for (const auto& e : events) st.ctx.log->warn("kv-offload {}: {}", st.self_name.instance, e);
}

void on_frame(OffloadActor* self, const runtime::InboundFrame& in);

// The changes one I/O answer reports, to the routers (a snapshot when removals overflowed).
void send_snapshot(OffloadActor* self);
void report_changes(OffloadActor* self, const Changes& c) {
  auto& st = self->state;
  if (c.overflowed) return send_snapshot(self);
  if (!c.stored.empty() || !c.removed.empty()) st.events->send_tier2(c.stored, c.removed, false);
}

// A snapshot for the routers: what the store holds now (nothing while it is not open: tier 2
// serves nothing then). Asked of the I/O actor, so it follows every write answered before.
void send_snapshot(OffloadActor* self) {
  auto& st = self->state;
  if (st.phase != OffloadState::Phase::open) return st.events->send_tier2({}, {}, true);
  if (st.snapshot_pending) return;  // the one in flight answers this ask too
  st.snapshot_pending = true;
  self->request(st.io, io_timeout, Held{})
      .then(
          [self](const HeldList& held) {
            self->state.snapshot_pending = false;
            self->state.events->send_tier2(held.blocks, {}, true);
          },
          [self](caf::error& e) {
            self->state.snapshot_pending = false;
            self->state.ctx.log->warn("kv-offload {}: no snapshot for the routers: {}",
                                      self->state.self_name.instance, to_string(e));
          });
}

// Forgets a store that failed to open (its I/O actor and staging), so that the next block
// opens it again.
void reset_store(OffloadActor* self) {
  auto& st = self->state;
  RT_ASSERT(st.phase == OffloadState::Phase::failed && !st.core, "only a store that never opened");
  if (st.io) {
    self->unlink_from(st.io);
    self->send_exit(st.io, caf::exit_reason::user_shutdown);
    st.io = caf::actor();
  }
  st.staging.reset();
  st.phase = OffloadState::Phase::closed;
  st.retry_open_after_ns.reset();
  st.ctx.log->info("kv-offload {}: opening tier 2 again", st.self_name.instance);
}

// Opens the store for `layout` (the first block this node's tier 2 sees): allocates and
// registers the staging slots, asks the I/O actor to open, replays the frames that waited.
void open_store(OffloadActor* self, const devices::KvLayout& layout) {
  auto& st = self->state;
  const auto& kv = st.ctx.manifest->kv_offload;
  auto fail = [&](const std::string& why) {
    st.phase = OffloadState::Phase::failed;
    st.failure = why;
    st.ctx.log->error("kv-offload {}: tier 2 is off: {}", st.self_name.instance, why);
  };
  auto* fabric = st.ctx.bridge->fabric();
  if (fabric == nullptr) return fail("this node has no fabric endpoint");
  auto staging = std::make_shared<Staging>();
  staging->block_bytes = layout.block_bytes();
  staging->slot_bytes = (staging->block_bytes + 4095) / 4096 * 4096;
  staging->slots = kv.staging_blocks;
  uint64_t bytes = staging->slot_bytes * staging->slots;
  staging->memory.reset(static_cast<std::byte*>(std::aligned_alloc(4096, bytes)));
  if (!staging->memory) return fail("cannot allocate " + std::to_string(bytes) + " staging bytes");
  auto region = fabric->register_memory(staging->memory.get(), bytes);
  if (!region.ok()) return fail("cannot register staging memory: " + region.error().describe());
  staging->region = std::move(region).value();
  st.staging = staging;
  st.layout = layout;
  st.fingerprint = fingerprint_of(*st.ctx.manifest, layout);
  st.io = runtime::spawn_fn<caf::detached>(
      self->system(), [staging](IoActor* io) { return io_behavior(io, staging); });
  self->link_to(st.io);  // the I/O actor goes with the shell (and its staging memory)
  kv::tier2::Tier2Config c;
  c.directory = (std::filesystem::path(kv.path) / st.self_name.node).string();
  c.capacity_bytes = kv.capacity_bytes;
  c.block_bytes = staging->block_bytes;
  c.host_cache_bytes = kv.host_cache_bytes;
  c.fingerprint = st.fingerprint;
  std::error_code ec;
  std::filesystem::create_directories(c.directory, ec);
  st.phase = OffloadState::Phase::opening;
  self->request(st.io, io_timeout, Open{c})
      .then(
          [self](Opened& o) {
            auto& st = self->state;
            if (!o.error.empty()) {
              st.phase = OffloadState::Phase::failed;
              st.failure = o.error;
              st.open_retry_ns = std::clamp<int64_t>(st.open_retry_ns * 2, open_retry_min_ns,
                                                     open_retry_max_ns);
              st.retry_open_after_ns = now_ns().count() + st.open_retry_ns;
              st.ctx.log->error("kv-offload {}: tier 2 is off: {} (tried again in {} s)",
                                st.self_name.instance, o.error, st.open_retry_ns / 1'000'000'000);
            } else {
              st.open_retry_ns = 0;
              st.retry_open_after_ns.reset();
              st.core.emplace(core_config(*st.ctx.manifest, o.stats.blocks_capacity_count));
              for (const auto& h : o.held) st.core->note_held(h);
              st.phase = OffloadState::Phase::open;
              st.io_mode = o.io_mode;
              add_stats(st, o.stats);
              st.ctx.log->info("kv-offload {}: tier 2 open ({} I/O): {} blocks held of {}",
                               st.self_name.instance, o.io_mode, o.held.size(),
                               o.stats.blocks_capacity_count);
              st.events->send_tier2(o.held, {}, true);
            }
            std::deque<runtime::InboundFrame> replay;
            replay.swap(st.waiting);
            for (const auto& f : replay) on_frame(self, f);
          },
          [self](caf::error& e) {
            auto& st = self->state;
            st.phase = OffloadState::Phase::failed;
            st.failure = "the store did not open: " + to_string(e);
            std::deque<runtime::InboundFrame> replay;
            replay.swap(st.waiting);
            for (const auto& f : replay) on_frame(self, f);
          });
}

void reply_store_done(OffloadActor* self, const ActorName& to, uint64_t id, uint32_t stored) {
  auto& st = self->state;
  (void)st.ctx.bridge->send(st.self_name, to, id, [&](wire::Envelope::Builder b) {
    auto done = b.getBody().initOffloadStoreDone();
    done.setRequestId(id);
    done.setStoredBlocks(stored);
  });
}

void reply_lookup(OffloadActor* self, const ActorName& to, uint64_t id,
                  const std::vector<kv_offload::LookupGrant>& staged) {
  auto& st = self->state;
  (void)st.ctx.bridge->send(st.self_name, to, id, [&](wire::Envelope::Builder b) {
    auto reply = b.getBody().initOffloadLookupReply();
    reply.setRequestId(id);
    reply.setDiskBytesPerS(st.read_bytes_per_s);
    auto blocks = reply.initBlocks(static_cast<unsigned>(staged.size()));
    const auto& reg = *st.staging->region;
    runtime::RemoteRegionRef region{reg.remote_base(), reg.length_bytes(), reg.key()};
    for (unsigned i = 0; i < staged.size(); ++i) {
      fill_block_descriptor(blocks[i], st.ctx.bridge->fabric()->address(), region,
                            uint64_t{staged[i].slot} * st.staging->slot_bytes,
                            &staged[i].hash, st.layout);
    }
  });
}

void write_slots(OffloadActor* self, std::vector<kv_offload::StoreWrite> writes) {
  auto& st = self->state;
  if (writes.empty()) return;
  if (!st.maintenance.empty()) {  // a verify or drop holds the disk: drop, never queue behind
    for (const auto& w : writes) {
      Status freed = st.core->store_written(w.slot, false);
      RT_ASSERT(freed.ok(), w.slot);
      st.metrics->dropped_blocks->inc();
    }
    return;
  }
  auto slots = std::make_shared<std::vector<kv_offload::StoreWrite>>(writes);
  const uint64_t queued = slots->size() * st.staging->block_bytes;
  st.io_queued_bytes += queued;
  self->request(st.io, io_timeout, Write{std::move(writes)})
      .then(
          [self, slots, queued](const IoDone& done) {
            auto& st = self->state;
            st.io_queued_bytes -= std::min(st.io_queued_bytes, queued);
            RT_ASSERT(done.ok.size() == slots->size(), done.ok.size(), slots->size());
            for (size_t i = 0; i < slots->size(); ++i) {
              Status s = st.core->store_written((*slots)[i].slot, done.ok[i]);
              RT_ASSERT(s.ok(), (*slots)[i].slot);
              (done.ok[i] ? st.metrics->stored_blocks : st.metrics->dropped_blocks)->inc();
            }
            add_stats(st, done.stats);
            log_events(st, done.events);
            report_changes(self, done.changes);
          },
          [self](caf::error& e) {
            // A disk that does not answer: its slots stay owned (the I/O actor may still
            // write them), and tier 2 stops taking work rather than risk a slot reused.
            auto& st = self->state;
            st.phase = OffloadState::Phase::failed;
            st.failure = "a write did not finish: " + to_string(e);
            st.ctx.log->error("kv-offload {}: tier 2 is off: {}", st.self_name.instance,
                              st.failure);
          });
}

void on_store_rma(OffloadActor* self, const StoreRmaDone& done) {
  auto& st = self->state;
  if (!st.core) return;
  if (!done.ok) {
    st.ctx.log->debug("kv-offload {}: reading an offered block failed: {}",
                      st.self_name.instance, done.error);
  }
  auto to = st.store_reply_to.find(done.key);
  RT_ASSERT(to != st.store_reply_to.end(), done.key.request);
  // The offerer pins the blocks for hold_timeout_ms from its send; a read that ended later
  // than half of it after the offer arrived here may have read a block already reused: not
  // stored. (This node's elapsed time is at most the offerer's: the offer was sent first.)
  auto half = std::chrono::milliseconds(st.ctx.manifest->kv_offload.hold_timeout_ms) / 2;
  bool in_time = now_ns() - to->second.received <= half;
  auto ended = st.core->store_read_done(done.key, done.slot, done.ok && in_time);
  RT_ASSERT(ended.ok(), done.slot);
  if (!ended->has_value()) return;
  auto writes = std::move(**ended);
  reply_store_done(self, to->second.from, done.key.request,
                   static_cast<uint32_t>(writes.size()));
  st.store_reply_to.erase(to);
  write_slots(self, std::move(writes));
}

Result<std::vector<Offer>> parse_offers(capnp::List<wire::BlockDescriptor>::Reader blocks) {
  std::vector<Offer> offers;
  for (auto d : blocks) {
    auto hash = d.getBlockHash();
    if (hash.size() != 32) return make_error(ErrorKind::invalid, "a block hash is not 32 bytes");
    Offer o;
    std::memcpy(o.hash.bytes.data(), hash.begin(), 32);
    o.at = read_block_descriptor(d);
    const auto& segs = o.at.source.segments;
    if (segs.size() != 1 || segs[0].layer != 0 || segs[0].parts != o.at.source.layout.layers * 2 ||
        segs[0].offset_bytes != o.at.offset_bytes || !tier2_layout(o.at.source.layout)) {
      return make_error(ErrorKind::invalid,
                        "a block is not one whole-model block-major run (tier 2 keeps no other)");
    }
    offers.push_back(std::move(o));
  }
  return offers;
}

// Whether the store can take this message now; opens it or queues the frame otherwise.
// false: the caller answers "nothing" (tier 2 off, or the frame waits for the open).
bool ready_for(OffloadActor* self, const runtime::InboundFrame& in, wire::KvLayout::Reader l,
               bool& queued) {
  auto& st = self->state;
  queued = false;
  devices::KvLayout layout = read_kv_layout(l);
  if (!tier2_layout(layout)) return false;
  if (st.phase == OffloadState::Phase::failed && st.retry_open_after_ns &&
      now_ns().count() >= *st.retry_open_after_ns) {
    reset_store(self);  // a failed open: try again (the disk may have room now)
  }
  if (st.phase == OffloadState::Phase::closed) open_store(self, layout);
  if (st.phase == OffloadState::Phase::opening) {
    size_t waiting_max = st.ctx.manifest->kv_offload.stores_max +
                         st.ctx.manifest->kv_offload.lookups_max;
    if (st.waiting.size() >= waiting_max) return false;
    st.waiting.push_back(in);
    queued = true;
    return false;
  }
  if (st.phase != OffloadState::Phase::open) return false;
  if (!st.maintenance.empty()) return false;  // a verify or drop holds the disk
  // Another layout than the store's never matches (and is never stored).
  return layout == st.layout && l.getBlockBytes() == st.layout.block_bytes();
}

void on_store(OffloadActor* self, const runtime::InboundFrame& in,
              wire::OffloadStore::Reader req, const ActorName& from) {
  auto& st = self->state;
  uint64_t id = req.getRequestId();
  if (req.getBlocks().size() == 0) return reply_store_done(self, from, id, 0);
  bool queued = false;
  if (!ready_for(self, in, req.getBlocks()[0].getLayout(), queued)) {
    if (!queued) {
      st.metrics->dropped_blocks->inc(req.getBlocks().size());
      reply_store_done(self, from, id, 0);
    }
    return;
  }
  auto offers = parse_offers(req.getBlocks());
  if (!offers.ok()) return send_error(st.ctx, st.self_name, from, id, offers.error());
  std::vector<kv::BlockHash> hashes;
  for (const auto& o : *offers) hashes.push_back(o.hash);
  RequestKey key{from.to_string(), id};
  auto grants = st.core->begin_store(key, hashes);
  if (!grants.ok() || grants->empty()) {
    if (!grants.ok()) st.metrics->dropped_blocks->inc(hashes.size());
    return reply_store_done(self, from, id, 0);
  }
  st.store_reply_to[key] = {from, now_ns()};
  auto* fabric = st.ctx.bridge->fabric();
  caf::actor me = caf::actor_cast<caf::actor>(self);
  for (const auto& g : *grants) {
    const Offer& o = (*offers)[g.offer_index];
    auto peer = fabric->peer(o.at.address);
    Status started =
        o.at.length_bytes != st.staging->block_bytes
            ? Status(make_error(ErrorKind::invalid, "an offered block's size differs"))
        : !peer.ok()
            ? Status(peer.error())
            : fabric->read(*peer, o.at.region, o.at.offset_bytes, *st.staging->region,
                           uint64_t{g.slot} * st.staging->slot_bytes, o.at.length_bytes,
                           [me, key, slot = g.slot](Status s) {
                             caf::anon_send(me, StoreRmaDone{key, slot, s.ok(),
                                                             s.ok() ? "" : s.error().describe()});
                           });
    if (!started.ok()) {
      caf::anon_send(me, StoreRmaDone{key, g.slot, false, started.error().describe()});
    }
  }
}

void read_staged(OffloadActor* self, const RequestKey& key, const ActorName& from,
                 std::vector<kv_offload::LookupGrant> grants) {
  auto& st = self->state;
  std::vector<kv::BlockHash> hashes;
  for (const auto& g : grants) hashes.push_back(g.hash);
  auto kept = std::make_shared<std::vector<kv_offload::LookupGrant>>(grants);
  const uint64_t queued = kept->size() * st.staging->block_bytes;
  st.io_queued_bytes += queued;
  self->request(st.io, io_timeout, Read{std::move(grants), std::move(hashes)})
      .then(
          [self, key, from, kept, queued](const IoDone& done) {
            auto& st = self->state;
            st.io_queued_bytes -= std::min(st.io_queued_bytes, queued);
            // The disk's rate: verified reads the disk served (host cache hits would make it
            // look faster than it is).
            for (size_t i = 0; i < done.read_seconds.size() && i < done.from_disk.size(); ++i) {
              if (!done.from_disk[i]) continue;
              st.read_bytes_per_s = prefill::ewma(
                  st.read_bytes_per_s,
                  static_cast<double>(st.staging->block_bytes) /
                      std::max(done.read_seconds[i], 1e-9));
            }
            RT_ASSERT(done.ok.size() == kept->size(), done.ok.size(), kept->size());
            std::optional<std::vector<kv_offload::LookupGrant>> staged;
            for (size_t i = 0; i < kept->size(); ++i) {
              auto r = st.core->lookup_read_done(key, (*kept)[i].position, done.ok[i]);
              RT_ASSERT(r.ok(), (*kept)[i].position);
              if (!done.ok[i]) st.metrics->miss_blocks->inc();
              if (r->has_value()) staged = std::move(**r);
            }
            RT_ASSERT(staged.has_value(), "every read ended", key.request);
            st.metrics->hit_blocks->inc(staged->size());
            if (!staged->empty() && staged->back().sub_blocks > 0) st.metrics->partial_blocks->inc();
            for (double seconds : done.read_seconds) st.metrics->read_seconds->observe(seconds);
            add_stats(st, done.stats);
            log_events(st, done.events);
            report_changes(self, done.changes);
            reply_lookup(self, from, key.request, *staged);
          },
          [self](caf::error& e) {
            auto& st = self->state;
            st.phase = OffloadState::Phase::failed;
            st.failure = "a read did not finish: " + to_string(e);
            st.ctx.log->error("kv-offload {}: tier 2 is off: {}", st.self_name.instance,
                              st.failure);
          });
}

void on_lookup(OffloadActor* self, const runtime::InboundFrame& in,
               wire::OffloadLookup::Reader req, const ActorName& from) {
  auto& st = self->state;
  uint64_t id = req.getRequestId();
  st.metrics->lookups->inc();
  bool queued = false;
  if (!ready_for(self, in, req.getLayout(), queued)) {
    if (!queued) reply_lookup(self, from, id, {});
    return;
  }
  auto hashes = messages::get_hashes(req.getBlockHashes());
  if (!hashes.ok()) return send_error(st.ctx, st.self_name, from, id, hashes.error());
  auto sub = messages::get_hashes(req.getSubBlockHashes());
  if (!sub.ok()) return send_error(st.ctx, st.self_name, from, id, sub.error());
  const uint32_t k = sub->empty() ? 1 : req.getSubBlocks();
  const kv_offload::PartialAsk partial{*sub, k, sub->empty() ? 0 : req.getSubBlocksHeld(),
                                       req.getPartialGainMin()};
  if (Status valid = kv_offload::check_partial_ask(*hashes, partial); !valid.ok()) {
    return send_error(st.ctx, st.self_name, from, id, valid.error());
  }
  // Only what the disk reads, behind its queue, before the asker could compute it.
  const uint32_t asked = kv_offload::lookup_positions(*hashes, partial);
  uint32_t within = kv_offload::blocks_within_budget(
      asked, st.staging->block_bytes, static_cast<double>(req.getBudgetNs()) / 1e9,
      static_cast<double>(st.io_queued_bytes), st.read_bytes_per_s);
  st.metrics->over_budget->inc(asked - within);
  kv_offload::truncate_ask(*hashes, *sub, k, within);
  if (within == 0) return reply_lookup(self, from, id, {});
  RequestKey key{from.to_string(), id};
  auto grants =
      st.core->begin_lookup(key, *hashes, now_ns(), {*sub, k, partial.held, partial.gain_min});
  if (!grants.ok() || grants->empty()) return reply_lookup(self, from, id, {});
  read_staged(self, key, from, std::move(grants).value());
}

void on_frame(OffloadActor* self, const runtime::InboundFrame& in) {
  auto& st = self->state;
  auto envelope = in.frame->envelope();
  auto body = envelope.getBody();
  ActorName from = messages::get_name(envelope.getSource());
  switch (body.which()) {
    case wire::Envelope::Body::OFFLOAD_STORE:
      return on_store(self, in, body.getOffloadStore(), from);
    case wire::Envelope::Body::OFFLOAD_LOOKUP:
      return on_lookup(self, in, body.getOffloadLookup(), from);
    case wire::Envelope::Body::KV_PULL_DONE:  // the asker read its staged lookup
      if (st.core) (void)st.core->lookup_released({from.to_string(), body.getKvPullDone().getRequestId()});
      return;
    case wire::Envelope::Body::KV_RESYNC:  // a router lost track of this tier 2
      st.ctx.log->info("kv-offload {}: snapshot for {} ({})", st.self_name.instance,
                       from.to_string(), std::string(body.getKvResync().getReason()));
      return send_snapshot(self);
    case wire::Envelope::Body::PING:
      return runtime::answer_ping(st.ctx.bridge, st.self_name, envelope);
    default:
      st.ctx.log->warn("kv-offload {}: ignoring message kind {}", st.self_name.instance,
                       static_cast<int>(body.which()));
  }
}

// --- Admin commands (`tandem shell`'s tier2 view, verify and drop; LocalAdmin from the node) ---

using AdminPromise = caf::typed_response_promise<runtime::AdminResult>;

kv_offload::Tier2Status status_of(const OffloadState& st) {
  using kv_offload::Tier2State;
  kv_offload::Tier2Status s;
  s.node = st.self_name.node;
  s.instance = st.self_name.instance;
  switch (st.phase) {
    case OffloadState::Phase::closed:
      s.state = Tier2State::off;
      s.why = "not open yet: it opens at the first block a prefill offers or asks for";
      break;
    case OffloadState::Phase::opening:
      s.state = Tier2State::opening;
      break;
    case OffloadState::Phase::open:
      s.state = Tier2State::open;
      s.why = st.maintenance.empty() ? "" : st.maintenance + " running";
      s.io_mode = st.io_mode;
      break;
    case OffloadState::Phase::failed:
      s.state = st.ctx.manifest->kv_offload.enabled ? Tier2State::failed : Tier2State::off;
      s.why = st.failure;
      break;
  }
  s.blocks_used = st.stats.blocks_used_count;
  s.blocks_capacity = st.stats.blocks_capacity_count;
  s.block_bytes = st.staging ? st.staging->block_bytes : 0;
  s.counts = st.metrics->counts();
  s.rates = st.rates.rates();
  return s;
}

runtime::AdminResult refusal(const OffloadState& st, const std::string& why) {
  return runtime::AdminResult{false, st.self_name.to_string() + ": " + why + "\n", {}};
}

// Why a verify or drop cannot start now, if it cannot.
std::optional<std::string> not_maintainable(const OffloadState& st) {
  switch (st.phase) {
    case OffloadState::Phase::closed:
      return "tier 2 is not open yet: it opens at the first block a prefill offers or asks for";
    case OffloadState::Phase::opening:
      return "tier 2 is opening; try again";
    case OffloadState::Phase::failed:
      return "tier 2 is off: " + st.failure;
    case OffloadState::Phase::open:
      break;
  }
  if (!st.maintenance.empty()) return "a " + st.maintenance + " is running; try again after it";
  return std::nullopt;
}

runtime::AdminResult maintained(OffloadActor* self, bool drop, const Maintained& m) {
  auto& st = self->state;
  for (const auto& h : m.removed) st.core->note_removed(h);
  add_stats(st, m.stats);
  log_events(st, m.events);
  report_changes(self, m.changes);
  if (!m.error.empty()) return refusal(st, "tier2 drop failed: " + m.error);
  if (drop) {
    kv_offload::Tier2DropOutcome d{st.self_name.node, st.self_name.instance,
                                   m.dropped.dropped_count, m.dropped.pinned_count, m.took};
    st.ctx.log->info("kv-offload {}: tier2 drop: {} blocks dropped", st.self_name.instance,
                     d.dropped_count);
    return runtime::AdminResult{true, kv_offload::tier2_drop_text(d),
                                kv_offload::tier2_drop_rows(d)};
  }
  kv_offload::Tier2VerifyOutcome v{st.self_name.node,
                                   st.self_name.instance,
                                   m.verified.checked_count,
                                   m.verified.ok_count,
                                   {},
                                   m.took};
  for (size_t r = 0; r < kv::tier2::tier2_miss_reasons_count; ++r) {
    auto reason = static_cast<kv::tier2::Tier2Miss>(r);
    if (reason == kv::tier2::Tier2Miss::absent) continue;  // verify reads stored blocks only
    v.dropped_by_reason.emplace_back(std::string(kv::tier2::to_string(reason)),
                                     m.verified.dropped_count[r]);
  }
  st.ctx.log->info("kv-offload {}: tier2 verify: {} blocks checked, {} dropped",
                   st.self_name.instance, v.checked_count, v.dropped_count());
  return runtime::AdminResult{true, kv_offload::tier2_verify_text(v),
                              kv_offload::tier2_verify_rows(v)};
}

// Runs a verify or drop on the I/O actor (it blocks on the disk). Lookups and offers that
// arrive meanwhile find nothing and are dropped, never queued behind it.
void start_maintenance(OffloadActor* self, bool drop, std::chrono::milliseconds timeout,
                       AdminPromise& promise) {
  auto& st = self->state;
  st.maintenance = drop ? "drop" : "verify";
  // Answer the node before it stops waiting (its wait is `timeout`).
  auto wait = std::max<std::chrono::milliseconds>(timeout - std::chrono::seconds(5),
                                                  std::chrono::seconds(1));
  auto shared = std::make_shared<AdminPromise>(std::move(promise));
  auto sent = drop ? self->request(st.io, wait, DropAll{}) : self->request(st.io, wait, Verify{});
  sent.then(
      [self, drop, shared](const Maintained& m) {
        auto& st = self->state;
        st.maintenance.clear();
        shared->deliver(maintained(self, drop, m));
      },
      [self, shared](caf::error& e) {
        // The disk did not answer in time: the I/O actor may still be busy with it, so
        // tier 2 stops taking work, as when a write does not finish.
        auto& st = self->state;
        st.failure = "a " + st.maintenance + " did not finish: " + to_string(e);
        st.maintenance.clear();
        st.phase = OffloadState::Phase::failed;
        st.ctx.log->error("kv-offload {}: tier 2 is off: {}", st.self_name.instance, st.failure);
        shared->deliver(refusal(st, st.failure));
      });
}

// An answer now, or nullopt when `promise` went to a maintenance run (answered at its end).
std::optional<runtime::AdminResult> on_admin(OffloadActor* self, const runtime::LocalAdmin& cmd,
                                             AdminPromise& promise) {
  auto& st = self->state;
  bool drop = cmd.command == "tier2-drop";
  if (!cmd.args.empty()) return refusal(st, cmd.command + " takes no arguments");
  if (cmd.command == "tier2") {
    auto status = status_of(st);
    return runtime::AdminResult{
        true,
        kv_offload::tier2_status_text(status),
        {kv_offload::tier2_status_header(), kv_offload::tier2_status_row(status)}};
  }
  if (cmd.command != "tier2-verify" && !drop) {
    return refusal(st, "unknown command '" + cmd.command + "'");
  }
  if (auto why = not_maintainable(st)) return refusal(st, *why);
  start_maintenance(self, drop, cmd.timeout, promise);
  return std::nullopt;
}

caf::behavior offload_behavior(OffloadActor* self) {
  self->delayed_send(self, shell_tick_interval, runtime::atoms::tick::value);
  return {
      [self](const runtime::InboundFrame& in) {
        auto& st = self->state;
        st.guard->run_frame(st.self_name, in, [self, &in] { on_frame(self, in); });
      },
      [self](const StoreRmaDone& done) {
        (void)self->state.guard->run("an RMA read", [self, &done] { on_store_rma(self, done); });
      },
      [self](const runtime::LocalAdmin& cmd) -> caf::result<runtime::AdminResult> {
        auto& st = self->state;
        auto promise = self->make_response_promise<runtime::AdminResult>();
        std::optional<runtime::AdminResult> now;
        Status ran = st.guard->run("an admin command", [self, &cmd, &promise, &now] {
          now = on_admin(self, cmd, promise);
        });
        if (!ran.ok()) now = refusal(st, ran.error().describe());
        if (now && promise.pending()) promise.deliver(std::move(*now));
        return promise;
      },
      [self](runtime::atoms::tick) {
        auto& st = self->state;
        // The routers find a lost last frame by this (actors/router/kv_sequence.hpp).
        const auto& m = *st.ctx.manifest;
        auto keepalive = std::chrono::milliseconds(m.router.kv_resync_interval_ms) / 2;
        if (m.kv_offload.enabled && now_ns() - st.keepalive_sent >= keepalive) {
          st.keepalive_sent = now_ns();
          st.events->send_tier2_keepalive();
        }
        st.rates.sample(now_ns(), st.metrics->counts());
        if (st.core) {
          for (const auto& key : st.core->expire(now_ns())) {
            st.ctx.log->warn("kv-offload {}: lookup {} of {} was never released; freed",
                             st.self_name.instance, key.request, key.requester);
          }
        }
        self->delayed_send(self, shell_tick_interval, runtime::atoms::tick::value);
      },
  };
}

}  // namespace

Status check_tier2_directory(const config::Manifest& manifest, const std::string& node) {
  const auto& kv = manifest.kv_offload;
  std::filesystem::path dir = std::filesystem::path(kv.path) / node;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return make_error(ErrorKind::invalid, "kv_offload.path: cannot create " + dir.string() + ": " +
                                              (ec ? ec.message() : "not a directory"));
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return make_error(ErrorKind::invalid, "kv_offload.path: " + dir.string() + " is not writable");
  }
  struct statvfs fs {};
  if (statvfs(dir.c_str(), &fs) != 0) {
    return make_error(ErrorKind::invalid, "kv_offload.path: cannot stat " + dir.string());
  }
  uint64_t free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
  uint64_t existing = 0;
  auto data = dir / "tier2.data";
  if (std::filesystem::exists(data, ec)) existing = std::filesystem::file_size(data, ec);
  uint64_t needed = kv.capacity_bytes > existing ? kv.capacity_bytes - existing : 0;
  if (needed + kv::tier2::index_reserve_bytes > free_bytes) {
    return make_error(ErrorKind::invalid,
                      "kv_offload.capacity_bytes: " + std::to_string(kv.capacity_bytes) +
                          " bytes and " + std::to_string(kv::tier2::index_reserve_bytes) +
                          " for the index do not fit in " + dir.string() + " (" +
                          std::to_string(free_bytes) + " bytes free)");
  }
  return {};
}

caf::actor spawn_kv_offload(caf::actor_system& system, const ShellContext& ctx,
                            const config::Instance& instance) {
  ActorName name{ctx.bridge->node(), "kv-offload", instance.name};
  auto init = [ctx, name](OffloadActor* self) -> caf::behavior {
    auto& st = self->state;
    st.ctx = ctx;
    st.self_name = name;
    st.guard.emplace(ctx, "kv-offload");
    st.metrics = std::make_unique<Tier2Metrics>(*ctx.metrics, name.instance);
    st.events.emplace(ctx, name);
    if (!ctx.manifest->kv_offload.enabled) {
      st.phase = OffloadState::Phase::failed;
      st.failure = "kv_offload.enabled is false";
    }
    return offload_behavior(self);
  };
  auto actor = runtime::spawn_fn(system, init);
  ctx.bridge->register_actor(name, actor);
  return actor;
}

}  // namespace tandem::actors
