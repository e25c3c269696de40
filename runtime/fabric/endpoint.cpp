#include "runtime/fabric/endpoint.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace tandem::runtime {

Result<std::pair<std::string, uint16_t>> split_host_port(std::string_view text) {
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return make_error(ErrorKind::invalid, "address '" + std::string(text) + "' is not host:port");
  }
  unsigned port = 0;
  auto port_text = text.substr(colon + 1);
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return make_error(ErrorKind::invalid, "address '" + std::string(text) + "' has a bad port");
  }
  return std::make_pair(std::string(text.substr(0, colon)), static_cast<uint16_t>(port));
}

namespace {

std::string fi_error_text(const char* what, int rc) {
  return std::string(what) + ": " + fi_strerror(rc < 0 ? -rc : rc) + " (" + std::to_string(rc) +
         ")";
}

// Every posted operation carries one of these as its context (fi_context2 first).
struct Op {
  fi_context2 ctx;
  enum class Kind { recv, send, read } kind = Kind::recv;
  size_t recv_index = 0;
  uint64_t peer_id = 0;
  std::vector<std::byte> frame;
  std::shared_ptr<struct ReadJob> job;
  uint64_t length_bytes = 0;
};

struct ReadJob {
  FabricEndpoint::ReadDone done;
  uint64_t chunks_left = 0;
  bool finished = false;
};

struct PendingRead {
  uint64_t peer_id;
  std::byte* local;
  void* local_desc;
  uint64_t remote_addr;
  uint64_t key;
  uint64_t length_bytes;
  std::shared_ptr<ReadJob> job;
};

// A frame waiting for the peer's session (with a channel), not sealed yet.
struct Waiting {
  std::vector<std::byte> frame;
  bool control = false;
};

struct Peer {
  uint64_t id = 0;
  std::string address;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  uint32_t inflight = 0;
  std::deque<std::vector<std::byte>> queue;
  uint32_t control_queued = 0;  // queue[0, control_queued) are control frames
  std::deque<Waiting> waiting;  // with a channel: frames for a session still being made
  // Held from sealing a frame to queueing it, so a peer's frames queue in sequence order.
  std::shared_ptr<std::mutex> order = std::make_shared<std::mutex>();
  uint64_t last_used = 0;  // Endpoint::use_clock_ when last sent to or resolved
};

class Region final : public MemoryRegion {
 public:
  Region(fid_mr* mr, std::byte* base, uint64_t length, uint64_t remote_base,
         std::atomic<int>* live)
      : mr_(mr), base_(base), length_(length), remote_base_(remote_base), live_(live) {
    live_->fetch_add(1);
  }
  ~Region() override {
    fi_close(&mr_->fid);
    live_->fetch_sub(1);
  }
  std::byte* base() const override { return base_; }
  uint64_t length_bytes() const override { return length_; }
  uint64_t key() const override { return fi_mr_key(mr_); }
  uint64_t remote_base() const override { return remote_base_; }
  void* desc() const { return fi_mr_desc(mr_); }

 private:
  fid_mr* mr_;
  std::byte* base_;
  uint64_t length_;
  uint64_t remote_base_;
  std::atomic<int>* live_;
};

class Endpoint final : public FabricEndpoint {
 public:
  Endpoint(FabricOptions options, FrameHandler on_frame)
      : options_(std::move(options)), on_frame_(std::move(on_frame)) {}
  ~Endpoint() override;

  Status open();
  std::string address() const override { return address_; }
  bool ordered() const { return ordered_; }
  std::string provider() const override { return provider_; }
  Result<PeerHandle> peer(const std::string& host_port) override;
  void reset_peer(const std::string& host_port) override;
  Status send(PeerHandle peer, std::vector<std::byte> frame, bool control) override;
  Status send(PeerHandle peer, std::span<const std::byte> frame, bool control) override;
  SessionInfo session_info(PeerHandle peer) override;
  Status refresh_session(PeerHandle peer) override;
  Result<std::unique_ptr<MemoryRegion>> register_memory(std::byte* base,
                                                        uint64_t length_bytes) override;
  Status read(PeerHandle peer, const RemoteRegionRef& remote, uint64_t remote_offset,
              const MemoryRegion& local, uint64_t local_offset, uint64_t length_bytes,
              ReadDone done) override;
  const FabricCounters& counters() const override { return counters_; }
  const FabricOptions& options() const override { return options_; }

 private:
  Status open_resources(fi_info* info);
  Status bind_address();
  Status post_recv(size_t index);
  void progress_loop();
  void handle_completion(const fi_cq_msg_entry& entry);
  void handle_error_completion();
  // A read chunk's completion (ok or failed): frees the op, finishes the chunk, pumps.
  void complete_read(Op* raw, Status status);
  void finish_send(Op* op, bool ok);
  Op* take_posted(Op* op);  // a completed send or read op leaves posted_ (mu_ not held)
  void finish_read_chunk(Op* op, Status status);
  void pump_peer(Peer& peer);      // mu_ held
  void pump_reads();               // mu_ held
  bool pump_all();  // true while RMA reads are posted or waiting
  void run_ready_callbacks();  // progress thread only; mu_ not held
  void wake();
  // With a channel:
  void on_received(std::span<std::byte> frame);  // progress thread
  Peer* peer_by_address_locked(const std::string& address);  // inserting it; mu_ held
  Status evict_one_locked();                                 // mu_ held
  void queue_locked(Peer& peer, std::vector<std::byte> frame, bool control);  // mu_ held
  void send_handshake(const std::string& address, std::vector<std::byte> frame);
  void flush_waiting(const std::string& address);  // a session became usable
  Status send_sealed(PeerHandle handle, std::span<const std::byte> frame, bool control);
  void handshake_tick();  // progress thread: resend INITs, expire handshakes
  uint64_t random_key();

  FabricOptions options_;
  FrameHandler on_frame_;
  std::string address_, provider_;
  bool virt_addr_ = false, prov_key_ = false, mr_endpoint_ = false, ordered_ = false;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  bool cq_waitable_ = false;

  std::vector<std::vector<std::byte>> recv_buffers_;
  std::vector<std::unique_ptr<Op>> recv_ops_;

  std::mutex mu_;
  std::map<std::string, uint64_t> peer_by_address_;
  std::unordered_map<uint64_t, Peer> peers_;
  uint64_t next_peer_id_ = 1;
  std::deque<PendingRead> reads_waiting_;
  uint32_t reads_inflight_ = 0;
  uint64_t use_clock_ = 0;  // mu_: counts peer uses (least recently used peer entry)
  std::mt19937_64 key_rng_{std::random_device{}()};  // mu_: memory keys (seeded per process)
  std::vector<std::pair<ReadDone, Status>> ready_;  // finished reads, callbacks not yet run
  // Send and read ops posted to the provider and not completed yet (mu_): their completion
  // takes them back; the ones still posted when the endpoint closes are freed by it.
  std::unordered_set<Op*> posted_;

  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<int> regions_live_{0};
  std::thread progress_;
  FabricCounters counters_;
};

Endpoint::~Endpoint() {
  stop_.store(true);
  wake();
  if (progress_.joinable()) progress_.join();
  RT_ASSERT(regions_live_.load() == 0, "memory regions outlived their endpoint");
  // Ops still posted die with the endpoint: free what we handed to the provider once the
  // endpoint is closed (no completion can name them after that; the progress thread is gone).
  if (ep_) fi_close(&ep_->fid);
  for (Op* op : posted_) delete op;
  posted_.clear();
  if (av_) fi_close(&av_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (info_) fi_freeinfo(info_);
}

Status Endpoint::open() {
  fi_info* hints = fi_allocinfo();
  RT_ASSERT(hints != nullptr);
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_RMA | FI_READ | FI_REMOTE_READ;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // Send-after-send ordering: a peer's frames arrive in the order they were posted, so the
  // channel can refuse any frame whose sequence number is not above the last one.
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->fabric_attr->prov_name = strdup(options_.provider.c_str());
  std::string port = std::to_string(options_.port);
  const std::string& bind = options_.bind_host.empty() ? options_.host : options_.bind_host;
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), bind.c_str(), port.c_str(), FI_SOURCE, hints, &info);
  fi_freeinfo(hints);
  if (rc != 0 || info == nullptr) {
    return make_error(ErrorKind::failed, fi_error_text(("no libfabric provider '" +
                                                        options_.provider + "' for " +
                                                        bind + ":" + port +
                                                        " with send-after-send ordering")
                                                           .c_str(),
                                                       rc));
  }
  info_ = info;
  provider_ = info->fabric_attr->prov_name;
  virt_addr_ = info->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
  prov_key_ = info->domain_attr->mr_mode & FI_MR_PROV_KEY;
  mr_endpoint_ = info->domain_attr->mr_mode & FI_MR_ENDPOINT;
  ordered_ = (info->tx_attr->msg_order & FI_ORDER_SAS) && (info->rx_attr->msg_order & FI_ORDER_SAS);
  if (options_.channel && !ordered_) {
    return make_error(ErrorKind::failed, "provider '" + provider_ +
                                             "' does not keep send-after-send order, which the "
                                             "authenticated channel needs");
  }
  RT_ASSERT(!(info->domain_attr->mr_mode & FI_MR_LOCAL),
            "providers needing local registration of send buffers are not supported yet");
  if (Status s = open_resources(info); !s.ok()) return s;
  if (Status s = bind_address(); !s.ok()) return s;
  if (options_.channel) options_.channel->set_self_address(address_);
  recv_buffers_.resize(options_.recv_buffers);
  size_t overhead = options_.channel ? SecureChannel::overhead_bytes : 0;
  for (size_t i = 0; i < recv_buffers_.size(); ++i) {
    recv_buffers_[i].resize(options_.frame_bytes_max + overhead);
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::recv;
    op->recv_index = i;
    recv_ops_.push_back(std::move(op));
    if (Status s = post_recv(i); !s.ok()) return s;
  }
  progress_ = std::thread([this] { progress_loop(); });
  return {};
}

Status Endpoint::open_resources(fi_info* info) {
  int rc = fi_fabric(info->fabric_attr, &fabric_, nullptr);
  if (rc) return make_error(ErrorKind::failed, fi_error_text("fi_fabric", rc));
  rc = fi_domain(fabric_, info, &domain_, nullptr);
  if (rc) return make_error(ErrorKind::failed, fi_error_text("fi_domain", rc));
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  cq_attr.size = options_.recv_buffers + 4096;
  cq_attr.wait_obj = FI_WAIT_UNSPEC;
  rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
  cq_waitable_ = rc == 0;
  if (rc) {
    cq_attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
    if (rc) return make_error(ErrorKind::failed, fi_error_text("fi_cq_open", rc));
  }
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_MAP;
  rc = fi_av_open(domain_, &av_attr, &av_, nullptr);
  if (rc) return make_error(ErrorKind::failed, fi_error_text("fi_av_open", rc));
  rc = fi_endpoint(domain_, info, &ep_, nullptr);
  if (rc) return make_error(ErrorKind::failed, fi_error_text("fi_endpoint", rc));
  rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (rc) return make_error(ErrorKind::failed, fi_error_text("fi_ep_bind(cq)", rc));
  rc = fi_ep_bind(ep_, &av_->fid, 0);
  if (rc) return make_error(ErrorKind::failed, fi_error_text("fi_ep_bind(av)", rc));
  rc = fi_enable(ep_);
  if (rc) {
    return make_error(ErrorKind::failed,
                      fi_error_text(("fi_enable on " + options_.host + ":" +
                                     std::to_string(options_.port) + " (port in use?)")
                                        .c_str(),
                                    rc));
  }
  return {};
}

Status Endpoint::bind_address() {
  char name[256];
  size_t len = sizeof(name);
  int rc = fi_getname(&ep_->fid, name, &len);
  if (rc) return make_error(ErrorKind::failed, fi_error_text("fi_getname", rc));
  char text[256];
  size_t text_len = sizeof(text);
  fi_av_straddr(av_, name, text, &text_len);
  // Socket-addressed providers report "fi_sockaddr_in://host:port"; keep host:port.
  std::string str(text);
  if (auto p = str.find("://"); p != std::string::npos) str = str.substr(p + 3);
  auto parsed = split_host_port(str);
  address_ = parsed.ok() ? options_.host + ":" + std::to_string(parsed->second) : str;
  return {};
}

Status Endpoint::post_recv(size_t index) {
  RT_ASSERT(index < recv_buffers_.size(), index);
  Op* op = recv_ops_[index].get();
  RT_ASSERT(op->kind == Op::Kind::recv);
  for (int attempt = 0; attempt < 100000; ++attempt) {
    ssize_t rc = fi_recv(ep_, recv_buffers_[index].data(), recv_buffers_[index].size(), nullptr,
                         FI_ADDR_UNSPEC, &op->ctx);
    if (rc == 0) return {};
    if (rc != -FI_EAGAIN) return make_error(ErrorKind::failed, fi_error_text("fi_recv", rc));
    fi_cq_msg_entry none[1];
    (void)fi_cq_read(cq_, none, 0);  // drive progress, then retry
  }
  return make_error(ErrorKind::failed, "fi_recv kept returning EAGAIN");
}

Result<PeerHandle> Endpoint::peer(const std::string& host_port) {
  std::lock_guard lock(mu_);
  if (auto it = peer_by_address_.find(host_port); it != peer_by_address_.end()) {
    peers_.at(it->second).last_used = ++use_clock_;
    return it->second;
  }
  if (peers_.size() >= options_.peers_max) {
    if (Status s = evict_one_locked(); !s.ok()) return s.error();
  }
  auto parts = split_host_port(host_port);
  if (!parts.ok()) return parts.error();
  fi_addr_t addr = FI_ADDR_UNSPEC;
  std::string port = std::to_string(parts->second);
  int rc = fi_av_insertsvc(av_, parts->first.c_str(), port.c_str(), &addr, 0, nullptr);
  if (rc != 1) {
    return make_error(ErrorKind::failed,
                      fi_error_text(("cannot add peer " + host_port + " to the address vector")
                                        .c_str(),
                                    rc));
  }
  uint64_t id = next_peer_id_++;
  Peer& p = peers_[id];
  p.id = id;
  p.address = host_port;
  p.addr = addr;
  p.last_used = ++use_clock_;
  peer_by_address_[host_port] = id;
  RT_ASSERT(peers_.size() <= options_.peers_max, peers_.size());
  return id;
}

// The least recently used peer with nothing in flight leaves (a client long gone, say); a
// peer the node talks to keeps being used, so it stays.
Status Endpoint::evict_one_locked() {
  Peer* victim = nullptr;
  for (auto& [id, p] : peers_) {
    if (p.inflight > 0 || !p.queue.empty() || !p.waiting.empty()) continue;
    if (victim == nullptr || p.last_used < victim->last_used) victim = &p;
  }
  if (victim == nullptr) {
    return make_error(ErrorKind::overloaded,
                      "fabric: " + std::to_string(options_.peers_max) + " peers are all busy");
  }
  fi_addr_t addr = victim->addr;
  (void)fi_av_remove(av_, &addr, 1, 0);
  if (options_.channel) options_.channel->reset_peer(victim->address);
  peer_by_address_.erase(victim->address);
  peers_.erase(victim->id);
  return {};
}

Peer* Endpoint::peer_by_address_locked(const std::string& address) {
  if (auto it = peer_by_address_.find(address); it != peer_by_address_.end()) {
    return &peers_.at(it->second);
  }
  return nullptr;
}

void Endpoint::reset_peer(const std::string& host_port) {
  std::lock_guard lock(mu_);
  auto it = peer_by_address_.find(host_port);
  if (it == peer_by_address_.end()) return;
  auto peer = peers_.find(it->second);
  RT_ASSERT(peer != peers_.end());
  fi_addr_t addr = peer->second.addr;
  (void)fi_av_remove(av_, &addr, 1, 0);
  peers_.erase(peer);  // completions of its posted ops find no peer and are only counted
  peer_by_address_.erase(it);
  if (options_.channel) options_.channel->reset_peer(host_port);
}

namespace {

Error queue_full(const std::string& address, uint32_t max) {
  return make_error(ErrorKind::overloaded, "send queue to " + address + " is full (" +
                                               std::to_string(max) + " frames)");
}

}  // namespace

void Endpoint::queue_locked(Peer& peer, std::vector<std::byte> frame, bool control) {
  if (control) {
    peer.queue.insert(peer.queue.begin() + peer.control_queued, std::move(frame));
    ++peer.control_queued;
  } else {
    peer.queue.push_back(std::move(frame));
  }
  pump_peer(peer);
}

Status Endpoint::send(PeerHandle handle, std::vector<std::byte> frame, bool control) {
  if (frame.empty() || frame.size() > options_.frame_bytes_max) {
    return make_error(ErrorKind::invalid, "frame of " + std::to_string(frame.size()) +
                                              " bytes (limit " +
                                              std::to_string(options_.frame_bytes_max) + ")");
  }
  if (options_.channel) return send_sealed(handle, frame, control);
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return make_error(ErrorKind::not_found, "unknown peer");
    Peer& peer = it->second;
    size_t limit = size_t{options_.send_queue_max} + (control ? control_reserve : 0);
    if (peer.queue.size() >= limit) {
      counters_.sends_refused.fetch_add(1, std::memory_order_relaxed);
      return queue_full(peer.address, options_.send_queue_max);
    }
    peer.last_used = ++use_clock_;
    queue_locked(peer, std::move(frame), control);
  }
  wake();
  return {};
}

Status Endpoint::send(PeerHandle handle, std::span<const std::byte> frame, bool control) {
  if (!options_.channel) {
    return send(handle, std::vector<std::byte>(frame.begin(), frame.end()), control);
  }
  if (frame.empty() || frame.size() > options_.frame_bytes_max) {
    return make_error(ErrorKind::invalid, "frame of " + std::to_string(frame.size()) +
                                              " bytes (limit " +
                                              std::to_string(options_.frame_bytes_max) + ")");
  }
  return send_sealed(handle, frame, control);  // sealed straight from the caller's bytes
}

// With a channel: seal on the peer's newest session and queue, or wait for a session while
// the handshake runs (starting it if none is in flight).
Status Endpoint::send_sealed(PeerHandle handle, std::span<const std::byte> frame, bool control) {
  SecureChannel& channel = *options_.channel;
  std::shared_ptr<std::mutex> order;
  std::shared_ptr<ChannelSession> session;
  std::string address;
  bool flush = false;
  size_t limit = size_t{options_.send_queue_max} + (control ? control_reserve : 0);
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return make_error(ErrorKind::not_found, "unknown peer");
    Peer& peer = it->second;
    peer.last_used = ++use_clock_;
    address = peer.address;
    session = channel.session_for(address);
    if (!session || !peer.waiting.empty()) {
      if (peer.waiting.size() + peer.queue.size() >= limit) {
        counters_.sends_refused.fetch_add(1, std::memory_order_relaxed);
        return queue_full(address, options_.send_queue_max);
      }
      peer.waiting.push_back(Waiting{std::vector<std::byte>(frame.begin(), frame.end()), control});
      if (session) {
        flush = true;  // the waiting frames go first, in order
      } else {
        auto init = channel.initiate(address, ChannelClock::now(),
                                     std::chrono::milliseconds(options_.handshake_resend_ms));
        if (!init.empty()) queue_locked(peer, std::move(init), true);
        wake();
        return {};
      }
    }
    order = peer.order;
  }
  if (flush) {
    flush_waiting(address);
    return {};
  }
  std::lock_guard order_lock(*order);
  std::vector<std::byte> sealed =
      SecureChannel::seal(*session, control ? Lane::control : Lane::data, frame);
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return make_error(ErrorKind::disconnected, "peer was reset");
    if (it->second.queue.size() >= limit) {
      counters_.sends_refused.fetch_add(1, std::memory_order_relaxed);
      return queue_full(address, options_.send_queue_max);
    }
    queue_locked(it->second, std::move(sealed), control);
  }
  wake();
  return {};
}

void Endpoint::send_handshake(const std::string& address, std::vector<std::byte> frame) {
  {
    std::lock_guard lock(mu_);
    Peer* peer = peer_by_address_locked(address);
    if (peer == nullptr) {
      // A peer that introduced itself (its INIT passed its MAC and `admit`): add it.
      auto parts = split_host_port(address);
      if (!parts.ok()) return;
      if (peers_.size() >= options_.peers_max && !evict_one_locked().ok()) return;
      fi_addr_t addr = FI_ADDR_UNSPEC;
      std::string port = std::to_string(parts->second);
      if (fi_av_insertsvc(av_, parts->first.c_str(), port.c_str(), &addr, 0, nullptr) != 1) return;
      uint64_t id = next_peer_id_++;
      Peer& p = peers_[id];
      p.id = id;
      p.address = address;
      p.addr = addr;
      p.last_used = ++use_clock_;
      peer_by_address_[address] = id;
      peer = &p;
    }
    queue_locked(*peer, std::move(frame), true);
  }
  wake();
}

// Seals the frames that waited for a session with `address`, in order, and queues them.
void Endpoint::flush_waiting(const std::string& address) {
  std::shared_ptr<ChannelSession> session = options_.channel->session_for(address);
  if (!session) return;
  std::shared_ptr<std::mutex> order;
  {
    std::lock_guard lock(mu_);
    Peer* peer = peer_by_address_locked(address);
    if (peer == nullptr) return;
    order = peer->order;
  }
  std::lock_guard order_lock(*order);
  std::deque<Waiting> waiting;
  {
    std::lock_guard lock(mu_);
    Peer* peer = peer_by_address_locked(address);
    if (peer == nullptr) return;
    waiting.swap(peer->waiting);
  }
  std::vector<std::pair<std::vector<std::byte>, bool>> sealed;
  sealed.reserve(waiting.size());
  for (auto& w : waiting) {
    sealed.emplace_back(SecureChannel::seal(*session, w.control ? Lane::control : Lane::data,
                                            w.frame),
                        w.control);
  }
  {
    std::lock_guard lock(mu_);
    Peer* peer = peer_by_address_locked(address);
    if (peer == nullptr) return;
    for (auto& [frame, control] : sealed) queue_locked(*peer, std::move(frame), control);
  }
  wake();
}

void Endpoint::handshake_tick() {
  SecureChannel& channel = *options_.channel;
  auto now = ChannelClock::now();
  for (const auto& address : channel.expire(now)) {
    std::lock_guard lock(mu_);
    Peer* peer = peer_by_address_locked(address);
    if (peer == nullptr || peer->waiting.empty()) continue;
    counters_.handshake_timeouts.fetch_add(1, std::memory_order_relaxed);
    counters_.send_errors.fetch_add(peer->waiting.size(), std::memory_order_relaxed);
    peer->waiting.clear();
  }
  std::vector<std::string> waiting_for;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, peer] : peers_) {
      if (!peer.waiting.empty()) waiting_for.push_back(peer.address);
    }
  }
  auto resend = std::chrono::milliseconds(options_.handshake_resend_ms);
  for (const auto& address : waiting_for) {
    if (channel.session_for(address)) {
      flush_waiting(address);
      continue;
    }
    auto init = channel.initiate(address, now, resend);
    if (!init.empty()) send_handshake(address, std::move(init));
  }
}

void Endpoint::on_received(std::span<std::byte> frame) {
  auto got = options_.channel->on_frame(frame, ChannelClock::now());
  switch (got.kind) {
    case SecureChannel::Received::Kind::data:
      on_frame_(got.plaintext, got.from);
      return;
    case SecureChannel::Received::Kind::handshake:
      counters_.handshakes.fetch_add(got.established_address.empty() ? 0 : 1,
                                     std::memory_order_relaxed);
      if (!got.reply.empty()) send_handshake(got.reply_address, std::move(got.reply));
      if (!got.established_address.empty()) flush_waiting(got.established_address);
      return;
    case SecureChannel::Received::Kind::dropped:
      counters_.auth_dropped.fetch_add(1, std::memory_order_relaxed);
      if (options_.on_drop) options_.on_drop(got.reason, got.peer_hint);
      return;
  }
}

FabricEndpoint::SessionInfo Endpoint::session_info(PeerHandle handle) {
  if (!options_.channel) return {};
  std::string address;
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return {};
    address = it->second.address;
  }
  auto session = options_.channel->session_for(address);
  if (!session) return {};
  return {SecureChannel::id_of(*session), SecureChannel::peer_of(*session).incarnation};
}

Status Endpoint::refresh_session(PeerHandle handle) {
  if (!options_.channel) return make_error(ErrorKind::unimplemented, "no channel");
  std::string address;
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(handle);
    if (it == peers_.end()) return make_error(ErrorKind::not_found, "unknown peer");
    address = it->second.address;
  }
  auto init = options_.channel->initiate(address, ChannelClock::now(),
                                         std::chrono::milliseconds(options_.handshake_resend_ms));
  if (!init.empty()) send_handshake(address, std::move(init));
  return {};
}

uint64_t Endpoint::random_key() {
  std::lock_guard lock(mu_);
  uint64_t key = 0;
  while (key == 0) key = key_rng_();
  return key;
}

void Endpoint::pump_peer(Peer& peer) {
  while (!peer.queue.empty() && peer.inflight < options_.sends_inflight_max) {
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::send;
    op->peer_id = peer.id;
    op->frame = std::move(peer.queue.front());
    ssize_t rc = fi_send(ep_, op->frame.data(), op->frame.size(), nullptr, peer.addr, &op->ctx);
    if (rc == -FI_EAGAIN) {
      peer.queue.front() = std::move(op->frame);  // the progress thread retries
      return;
    }
    peer.queue.pop_front();
    if (peer.control_queued > 0) --peer.control_queued;
    if (rc != 0) {
      counters_.send_errors.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    ++peer.inflight;
    posted_.insert(op.get());  // in the provider's hands until its completion (finish_send)
    (void)op.release();
  }
}

Result<std::unique_ptr<MemoryRegion>> Endpoint::register_memory(std::byte* base,
                                                                uint64_t length_bytes) {
  if (base == nullptr || length_bytes == 0) {
    return make_error(ErrorKind::invalid, "cannot register an empty region");
  }
  fid_mr* mr = nullptr;
  // Destination of our reads, source of peers' reads; no peer may write into it.
  uint64_t access = FI_READ | FI_REMOTE_READ;
  int rc = -FI_ENOKEY;
  // A random key (the provider ignores it where it chooses its own): a collision with a key
  // in use is refused by the provider (-FI_ENOKEY) and another is drawn.
  for (int attempt = 0; attempt < 16 && rc == -FI_ENOKEY; ++attempt) {
    rc = fi_mr_reg(domain_, base, length_bytes, access, 0, random_key(), 0, &mr, nullptr);
  }
  if (rc) return make_error(ErrorKind::failed, fi_error_text("fi_mr_reg", rc));
  if (mr_endpoint_) {
    rc = fi_mr_bind(mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc) {
      fi_close(&mr->fid);
      return make_error(ErrorKind::failed, fi_error_text("fi_mr_bind/enable", rc));
    }
  }
  uint64_t remote_base = virt_addr_ ? reinterpret_cast<uint64_t>(base) : 0;
  return std::unique_ptr<MemoryRegion>(
      std::make_unique<Region>(mr, base, length_bytes, remote_base, &regions_live_));
}

Status Endpoint::read(PeerHandle handle, const RemoteRegionRef& remote, uint64_t remote_offset,
                      const MemoryRegion& local, uint64_t local_offset, uint64_t length_bytes,
                      ReadDone done) {
  if (length_bytes == 0) return make_error(ErrorKind::invalid, "RMA read of zero bytes");
  if (remote_offset > remote.length_bytes || length_bytes > remote.length_bytes - remote_offset) {
    return make_error(ErrorKind::invalid, "RMA read past the end of the remote region");
  }
  if (local_offset > local.length_bytes() || length_bytes > local.length_bytes() - local_offset) {
    return make_error(ErrorKind::invalid, "RMA read past the end of the local region");
  }
  const auto& region = static_cast<const Region&>(local);
  uint64_t chunk = options_.rma_chunk_bytes;
  uint64_t chunks = (length_bytes + chunk - 1) / chunk;
  {
    std::lock_guard lock(mu_);
    if (!peers_.count(handle)) return make_error(ErrorKind::not_found, "unknown peer");
    if (reads_waiting_.size() + chunks > options_.rma_queue_max) {
      return make_error(ErrorKind::overloaded, "RMA read queue is full");
    }
    auto job = std::make_shared<ReadJob>();
    job->done = std::move(done);
    job->chunks_left = chunks;
    for (uint64_t c = 0; c < chunks; ++c) {
      uint64_t offset = c * chunk;
      uint64_t len = std::min(chunk, length_bytes - offset);
      reads_waiting_.push_back(PendingRead{handle, region.base() + local_offset + offset,
                                           region.desc(),
                                           remote.remote_base + remote_offset + offset,
                                           remote.key, len, job});
    }
    pump_reads();
  }
  wake();
  return {};
}

void Endpoint::pump_reads() {
  while (!reads_waiting_.empty() && reads_inflight_ < options_.rma_inflight_max) {
    PendingRead& next = reads_waiting_.front();
    auto peer = peers_.find(next.peer_id);
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::read;
    op->job = next.job;
    op->length_bytes = next.length_bytes;
    if (peer == peers_.end()) {
      reads_waiting_.pop_front();
      finish_read_chunk(op.get(), make_error(ErrorKind::disconnected, "peer was reset"));
      continue;
    }
    ssize_t rc = fi_read(ep_, next.local, next.length_bytes, next.local_desc, peer->second.addr,
                         next.remote_addr, next.key, &op->ctx);
    if (rc == -FI_EAGAIN) return;
    reads_waiting_.pop_front();
    if (rc != 0) {
      finish_read_chunk(op.get(), make_error(ErrorKind::failed, fi_error_text("fi_read", rc)));
      continue;
    }
    ++reads_inflight_;
    posted_.insert(op.get());  // in the provider's hands until its completion
    (void)op.release();
  }
}

void Endpoint::finish_read_chunk(Op* op, Status status) {
  ReadJob& job = *op->job;
  RT_ASSERT(job.chunks_left > 0);
  --job.chunks_left;
  if (status.ok()) {
    counters_.rma_bytes.fetch_add(op->length_bytes, std::memory_order_relaxed);
  } else {
    counters_.rma_errors.fetch_add(1, std::memory_order_relaxed);
  }
  if (job.finished) return;
  if (!status.ok() || job.chunks_left == 0) {
    job.finished = true;
    if (status.ok()) counters_.rma_reads.fetch_add(1, std::memory_order_relaxed);
    // Run outside mu_ on the progress thread: the callback may send or read again.
    if (job.done) ready_.emplace_back(std::move(job.done), std::move(status));
  }
}

void Endpoint::run_ready_callbacks() {
  std::vector<std::pair<ReadDone, Status>> ready;
  {
    std::lock_guard lock(mu_);
    ready.swap(ready_);
  }
  for (auto& [done, status] : ready) done(status);
}

void Endpoint::finish_send(Op* op, bool ok) {
  if (ok) {
    counters_.frames_sent.fetch_add(1, std::memory_order_relaxed);
    counters_.bytes_sent.fetch_add(op->frame.size(), std::memory_order_relaxed);
  } else {
    counters_.send_errors.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard lock(mu_);
  auto peer = peers_.find(op->peer_id);
  if (peer == peers_.end()) return;  // reset while in flight
  RT_ASSERT(peer->second.inflight > 0);
  --peer->second.inflight;
  pump_peer(peer->second);
}

Op* Endpoint::take_posted(Op* op) {
  std::lock_guard lock(mu_);
  size_t erased = posted_.erase(op);
  RT_ASSERT(erased == 1, "a completion of an op not posted");
  return op;
}

void Endpoint::complete_read(Op* raw, Status status) {
  std::unique_ptr<Op> op(take_posted(raw));
  std::lock_guard lock(mu_);
  RT_ASSERT(reads_inflight_ > 0);
  --reads_inflight_;
  finish_read_chunk(op.get(), std::move(status));
  pump_reads();
}

void Endpoint::handle_completion(const fi_cq_msg_entry& entry) {
  Op* raw = static_cast<Op*>(entry.op_context);
  RT_ASSERT(raw != nullptr);
  switch (raw->kind) {
    case Op::Kind::recv: {
      counters_.frames_received.fetch_add(1, std::memory_order_relaxed);
      counters_.bytes_received.fetch_add(entry.len, std::memory_order_relaxed);
      RT_ASSERT(entry.len <= recv_buffers_[raw->recv_index].size(), entry.len);
      std::span<std::byte> frame(recv_buffers_[raw->recv_index].data(), entry.len);
      if (options_.channel) {
        on_received(frame);
      } else {
        on_frame_(frame, PeerRef());
      }
      Status s = post_recv(raw->recv_index);
      RT_ASSERT(s.ok(), s.error().describe());
      return;
    }
    case Op::Kind::send: {
      std::unique_ptr<Op> op(take_posted(raw));
      finish_send(op.get(), true);
      return;
    }
    case Op::Kind::read:
      complete_read(raw, {});
      return;
  }
}

void Endpoint::handle_error_completion() {
  fi_cq_err_entry err{};
  if (fi_cq_readerr(cq_, &err, 0) <= 0) return;
  Op* raw = static_cast<Op*>(err.op_context);
  if (raw == nullptr) return;
  switch (raw->kind) {
    case Op::Kind::recv: {
      // Oversized (truncated) or otherwise broken incoming frame: drop, count, re-post.
      counters_.frames_dropped.fetch_add(1, std::memory_order_relaxed);
      Status s = post_recv(raw->recv_index);
      RT_ASSERT(s.ok(), s.error().describe());
      return;
    }
    case Op::Kind::send: {
      std::unique_ptr<Op> op(take_posted(raw));
      finish_send(op.get(), false);
      return;
    }
    case Op::Kind::read:
      complete_read(raw, make_error(ErrorKind::failed, fi_error_text("RMA read", -err.err)));
      return;
  }
}

bool Endpoint::pump_all() {
  std::lock_guard lock(mu_);
  for (auto& [id, peer] : peers_) {
    if (!peer.queue.empty()) pump_peer(peer);
  }
  if (!reads_waiting_.empty()) pump_reads();
  return reads_inflight_ > 0 || !reads_waiting_.empty();
}

void Endpoint::wake() {
  if (sleeping_.load(std::memory_order_acquire) && cq_waitable_) fi_cq_signal(cq_);
}

void Endpoint::progress_loop() {
  using clock = std::chrono::steady_clock;
  fi_cq_msg_entry entries[32];
  auto last_activity = clock::now();
  auto last_tick = last_activity;
  auto spin = std::chrono::microseconds(options_.spin_us);
  while (!stop_.load(std::memory_order_acquire)) {
    if (options_.channel && clock::now() - last_tick >= std::chrono::milliseconds(20)) {
      last_tick = clock::now();
      handshake_tick();
    }
    ssize_t n = fi_cq_read(cq_, entries, 32);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) handle_completion(entries[i]);
      run_ready_callbacks();
      last_activity = clock::now();
      continue;
    }
    if (n == -FI_EAVAIL) {
      handle_error_completion();
      run_ready_callbacks();
      continue;
    }
    // An RMA read in flight is activity: its data arrives in many socket reads that only
    // our polling progresses (FI_PROGRESS_MANUAL), so sleeping now would only add wake-ups.
    if (pump_all()) last_activity = clock::now();
    run_ready_callbacks();
    if (clock::now() - last_activity < spin) {
      // Spin politely: on a machine with more runnable threads than cores, a peer (or the
      // thread that will consume our completion) may be waiting for this CPU.
      std::this_thread::yield();
      continue;
    }
    if (!cq_waitable_) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    sleeping_.store(true, std::memory_order_release);
    n = fi_cq_sread(cq_, entries, 32, nullptr, 5);
    sleeping_.store(false, std::memory_order_release);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) handle_completion(entries[i]);
      last_activity = clock::now();
    } else if (n == -FI_EAVAIL) {
      handle_error_completion();
    }
    run_ready_callbacks();
  }
}

}  // namespace

Result<std::unique_ptr<FabricEndpoint>> open_fabric(const FabricOptions& options,
                                                    FabricEndpoint::FrameHandler on_frame) {
  RT_ASSERT(on_frame != nullptr);
  RT_ASSERT(options.frame_bytes_max >= 64 && options.recv_buffers > 0);
  auto endpoint = std::make_unique<Endpoint>(options, std::move(on_frame));
  if (Status s = endpoint->open(); !s.ok()) return s.error();
  return std::unique_ptr<FabricEndpoint>(std::move(endpoint));
}

}  // namespace tandem::runtime
