// One libfabric endpoint per node: reliable datagram (FI_EP_RDM) messaging plus one-sided
// RMA reads, with a progress thread.
//
// Threads: every public method is thread-safe. Callbacks (on_frame, read completions) run on
// the endpoint's progress thread: they must be short and must not call stop() or destroy
// the endpoint. Actors are reached from them only by message.
//
// Bounds: per peer at most `sends_inflight_max` frames are posted to the provider and at
// most `send_queue_max` more wait in our queue; beyond that send() refuses with
// ErrorKind::overloaded (backpressure, never unbounded memory). RMA reads are split into
// chunks of at most `rma_chunk_bytes`, with at most `rma_inflight_max` chunks posted; at most
// `rma_queue_max` chunks wait behind them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/base/result.hpp"
#include "runtime/fabric/secure_channel.hpp"

namespace tandem::runtime {

struct FabricOptions {
  std::string provider = "tcp;ofi_rxm";
  std::string host = "127.0.0.1";      // the address peers reach this endpoint at
  std::string bind_host;               // the address to listen on; "" = host
  uint16_t port = 0;                   // 0 = an ephemeral port (clients)
  uint32_t send_queue_max = 1024;      // frames waiting per peer, beyond those posted
  uint32_t sends_inflight_max = 64;    // frames posted per peer
  uint32_t frame_bytes_max = 4u << 20;
  uint32_t recv_buffers = 32;
  uint32_t rma_chunk_bytes = 8u << 20;
  uint32_t rma_inflight_max = 16;
  uint32_t rma_queue_max = 65536;
  // Busy-poll (yielding the CPU after each empty poll) this long after the last completion,
  // then sleep in the CQ wait. Posted or queued RMA reads count as activity: the progress
  // thread keeps polling until they finish (a read that never completes keeps it polling).
  uint32_t spin_us = 50;
  // The authenticated channel (secure_channel.hpp): every frame sealed, peers authenticated
  // at connect, frames from anyone else dropped before they are parsed. Null: plaintext frames
  // from anyone (benchmark baselines and tests of the transport alone; never a node).
  std::shared_ptr<SecureChannel> channel;
  // With a channel: a frame that failed its checks (progress thread; short, thread-safe).
  std::function<void(ChannelDrop why, const std::string& peer_hint)> on_drop;
  uint32_t handshake_resend_ms = 250;  // an unanswered INIT is sent again this often
  uint32_t peers_max = 4096;           // peer entries; beyond, the least recently used goes
};

// Monotonic counters, readable from any thread.
struct FabricCounters {
  std::atomic<uint64_t> frames_sent{0}, bytes_sent{0};
  std::atomic<uint64_t> frames_received{0}, bytes_received{0};
  std::atomic<uint64_t> frames_dropped{0};    // oversized/truncated on receive
  std::atomic<uint64_t> send_errors{0};       // completions with an error (peer gone, ...)
  std::atomic<uint64_t> sends_refused{0};     // refused by backpressure
  std::atomic<uint64_t> rma_reads{0}, rma_bytes{0}, rma_errors{0};
  std::atomic<uint64_t> auth_dropped{0};       // frames the channel refused (on_drop)
  std::atomic<uint64_t> handshakes{0};         // sessions established, either side
  std::atomic<uint64_t> handshake_timeouts{0};  // initiations that got no answer in time
};

using PeerHandle = uint64_t;  // stable for the life of a peer entry; see reset_peer()

// A registered memory region. Destroying it unregisters it; it must not outlive its
// endpoint. `remote_base` is what a peer adds offsets to (0 under offset addressing).
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual std::byte* base() const = 0;
  virtual uint64_t length_bytes() const = 0;
  virtual uint64_t key() const = 0;
  virtual uint64_t remote_base() const = 0;
};

// Where a peer's region is, as carried in a BlockDescriptor / RemoteRegion message.
struct RemoteRegionRef {
  uint64_t remote_base = 0;
  uint64_t length_bytes = 0;
  uint64_t key = 0;
};

class FabricEndpoint {
 public:
  // Called once per received frame, on the progress thread, with the frame's bytes (valid
  // only during the call) and, with a channel, the authenticated sender (null without one).
  using FrameHandler =
      std::function<void(std::span<const std::byte> frame, const PeerRef& from)>;
  using ReadDone = std::function<void(Status)>;

  virtual ~FabricEndpoint() = default;

  // "host:port" this endpoint is bound to (the real port when opened with port 0).
  virtual std::string address() const = 0;
  virtual std::string provider() const = 0;

  // Resolves "host:port" to a peer (inserting it into the address vector once).
  // Errors: invalid (malformed address), failed (provider refused it).
  virtual Result<PeerHandle> peer(const std::string& host_port) = 0;
  // Forgets the peer's connection state (it restarted): frames queued for it are dropped
  // and the next peer() call makes a fresh entry. Safe to call for unknown addresses.
  virtual void reset_peer(const std::string& host_port) = 0;

  // Queues one frame to a peer. Errors: overloaded (queue full), not_found (unknown handle),
  // invalid (frame larger than frame_bytes_max or empty).
  // With a channel, frames to a peer without a session wait (in the same bound) while the
  // handshake runs; they are sealed and sent once it completes, and dropped (send_errors)
  // when it times out.
  // `control` frames (membership: hellos, heartbeats) go ahead of the peer's queued data
  // frames and may use control_reserve slots beyond send_queue_max, so a flood of data to a
  // peer cannot get this node declared down by it.
  virtual Status send(PeerHandle peer, std::vector<std::byte> frame, bool control = false) = 0;
  // The same, from bytes the caller keeps: copied, or with a channel sealed straight from
  // them (one pass over the frame instead of a copy and then the seal).
  virtual Status send(PeerHandle peer, std::span<const std::byte> frame, bool control = false) = 0;
  static constexpr uint32_t control_reserve = 64;

  // With a channel: the newest session with a peer (0s when none), and a new handshake with
  // it although a session exists (once it completes, frames go on the new session). A client
  // whose request went unanswered tells a restarted peer (a new incarnation: its old session
  // and the request on it are gone) from a slow one this way.
  struct SessionInfo {
    uint64_t session_id = 0;
    uint64_t peer_incarnation = 0;
  };
  virtual SessionInfo session_info(PeerHandle peer) = 0;
  virtual Status refresh_session(PeerHandle peer) = 0;

  // Registers [base, base+length) as the destination of this endpoint's reads and the
  // source of peers' reads (never writable by a peer). The key is the provider's where it
  // chooses keys (FI_MR_PROV_KEY), else a random 64-bit one: it cannot be guessed, and it
  // travels only inside sealed frames to the peer that needs it.
  virtual Result<std::unique_ptr<MemoryRegion>> register_memory(std::byte* base,
                                                                uint64_t length_bytes) = 0;

  // One-sided read of `length` bytes from the peer's region at `remote_offset` into `local`
  // at `local_offset`. `done` runs once on the progress thread when every chunk completed
  // (or the first failed). Errors returned directly: invalid (out of bounds), overloaded.
  virtual Status read(PeerHandle peer, const RemoteRegionRef& remote, uint64_t remote_offset,
                      const MemoryRegion& local, uint64_t local_offset, uint64_t length_bytes,
                      ReadDone done) = 0;

  virtual const FabricCounters& counters() const = 0;
  virtual const FabricOptions& options() const = 0;
};

// Opens the endpoint and starts its progress thread. Errors name the provider and address.
Result<std::unique_ptr<FabricEndpoint>> open_fabric(const FabricOptions& options,
                                                    FabricEndpoint::FrameHandler on_frame);

// "host:port" -> (host, port); invalid on anything else.
Result<std::pair<std::string, uint16_t>> split_host_port(std::string_view text);

}  // namespace tandem::runtime
