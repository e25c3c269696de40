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

namespace tandem::runtime {

struct FabricOptions {
  std::string provider = "tcp;ofi_rxm";
  std::string host = "127.0.0.1";
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
};

// Monotonic counters, readable from any thread.
struct FabricCounters {
  std::atomic<uint64_t> frames_sent{0}, bytes_sent{0};
  std::atomic<uint64_t> frames_received{0}, bytes_received{0};
  std::atomic<uint64_t> frames_dropped{0};    // oversized/truncated on receive
  std::atomic<uint64_t> send_errors{0};       // completions with an error (peer gone, ...)
  std::atomic<uint64_t> sends_refused{0};     // refused by backpressure
  std::atomic<uint64_t> rma_reads{0}, rma_bytes{0}, rma_errors{0};
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
  // Called once per received frame, on the progress thread, with the frame's bytes
  // (valid only during the call).
  using FrameHandler = std::function<void(std::span<const std::byte> frame)>;
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
  // `control` frames (membership: hellos, heartbeats) go ahead of the peer's queued data
  // frames and may use control_reserve slots beyond send_queue_max, so a flood of data to a
  // peer cannot get this node declared down by it.
  virtual Status send(PeerHandle peer, std::vector<std::byte> frame, bool control = false) = 0;
  static constexpr uint32_t control_reserve = 64;

  // Registers [base, base+length) for local writes and remote reads.
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
