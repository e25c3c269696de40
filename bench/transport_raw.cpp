#include "bench/transport_raw.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sched.h>
#include <sys/prctl.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto completion_timeout = std::chrono::seconds(10);
constexpr size_t recv_slots_count = 128;
constexpr size_t slot_bytes = 4096;
constexpr size_t message_bytes = 64;
// An empty poll yields the CPU (sched_yield) but never blocks. Pure spinning is bimodal on an
// oversubscribed machine (docs/benchmarks.md: ~13 us or ~12-16 ms per round trip, depending
// on whether the peer holds a CPU), which makes it no ceiling at all.
constexpr bool yield_when_idle = true;  // <= the provider's inject size (asserted)

Error fi_failure(const char* what, long rc) {
  return make_error(ErrorKind::failed, std::string("raw baseline: ") + what + ": " +
                                           fi_strerror(int(rc < 0 ? -rc : rc)));
}

// Context of every posted operation: which receive slot, or a send/read (slot = -1).
struct Ctx {
  fi_context2 ctx;
  long slot = -1;
};

// One RDM endpoint with a single completion queue that the caller busy-polls.
class RawEndpoint {
 public:
  ~RawEndpoint();
  Status open(const std::string& provider, const std::string& host, uint16_t port);
  Result<fi_addr_t> insert(const std::string& host_port);
  Status post_recv(size_t slot);
  Status send(fi_addr_t to, const void* bytes, size_t length);
  Status inject(fi_addr_t to, const void* bytes, size_t length);  // copied now; no completion
  Status read(fi_addr_t from, void* local, size_t length, uint64_t remote, uint64_t key);
  Result<std::unique_ptr<fid_mr, void (*)(fid_mr*)>> register_memory(void* base, size_t len);
  // Busy-polls until one completion; returns its receive slot (-1 send, -2 read).
  // Errors: timed_out after completion_timeout unless `forever`.
  Result<long> next_completion(bool forever = false);
  char* slot_bytes_at(size_t slot) { return recv_bytes_.data() + slot * slot_bytes; }
  // What a peer adds offsets to: the virtual address under FI_MR_VIRT_ADDR, else 0.
  uint64_t remote_base_of(const void* base) const {
    bool virt = info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
    return virt ? reinterpret_cast<uintptr_t>(base) : 0;
  }

 private:
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  void* local_desc_ = nullptr;
  std::vector<char> recv_bytes_ = std::vector<char>(recv_slots_count * slot_bytes);
  std::vector<Ctx> recv_ctx_ = std::vector<Ctx>(recv_slots_count);
  Ctx send_ctx_{{}, -1};  // every send completes with slot -1 (contexts may be shared)
  Ctx read_ctx_{{}, -2};  // every read completes with slot -2
};

RawEndpoint::~RawEndpoint() {
  if (ep_) fi_close(&ep_->fid);
  if (av_) fi_close(&av_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (info_) fi_freeinfo(info_);
}

Status RawEndpoint::open(const std::string& provider, const std::string& host, uint16_t port) {
  fi_info* hints = fi_allocinfo();
  RT_ASSERT(hints != nullptr);
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_RMA | FI_READ | FI_REMOTE_READ;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  std::string service = std::to_string(port);
  int rc = fi_getinfo(FI_VERSION(1, 17), host.c_str(), service.c_str(), FI_SOURCE, hints, &info_);
  fi_freeinfo(hints);
  if (rc != 0) return fi_failure(("fi_getinfo " + provider).c_str(), rc);
  RT_ASSERT(!(info_->domain_attr->mr_mode & FI_MR_LOCAL), "MR_LOCAL providers not supported");
  if ((rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr))) return fi_failure("fi_fabric", rc);
  if ((rc = fi_domain(fabric_, info_, &domain_, nullptr))) return fi_failure("fi_domain", rc);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  cq_attr.size = 4096;
  cq_attr.wait_obj = FI_WAIT_NONE;  // busy polling only
  if ((rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr))) return fi_failure("fi_cq_open", rc);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_MAP;
  if ((rc = fi_av_open(domain_, &av_attr, &av_, nullptr))) return fi_failure("fi_av_open", rc);
  if ((rc = fi_endpoint(domain_, info_, &ep_, nullptr))) return fi_failure("fi_endpoint", rc);
  if ((rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV))) return fi_failure("bind cq", rc);
  if ((rc = fi_ep_bind(ep_, &av_->fid, 0))) return fi_failure("bind av", rc);
  if ((rc = fi_enable(ep_))) return fi_failure("fi_enable (port in use?)", rc);
  for (size_t i = 0; i < recv_slots_count; ++i) {
    recv_ctx_[i].slot = long(i);
    if (Status s = post_recv(i); !s.ok()) return s;
  }
  return {};
}

Result<fi_addr_t> RawEndpoint::insert(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  RT_ASSERT(colon != std::string::npos, host_port);
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int rc = fi_av_insertsvc(av_, host_port.substr(0, colon).c_str(),
                           host_port.substr(colon + 1).c_str(), &addr, 0, nullptr);
  if (rc != 1) return fi_failure(("fi_av_insertsvc " + host_port).c_str(), rc);
  return addr;
}

Status RawEndpoint::post_recv(size_t slot) {
  RT_ASSERT(slot < recv_slots_count, slot);
  for (;;) {
    ssize_t rc = fi_recv(ep_, slot_bytes_at(slot), slot_bytes, nullptr, FI_ADDR_UNSPEC,
                         &recv_ctx_[slot].ctx);
    if (rc == 0) return {};
    if (rc != -FI_EAGAIN) return fi_failure("fi_recv", rc);
    fi_cq_msg_entry none[1];
    (void)fi_cq_read(cq_, none, 0);
  }
}

Status RawEndpoint::send(fi_addr_t to, const void* bytes, size_t length) {
  RT_ASSERT(length > 0 && length <= slot_bytes, length);
  for (;;) {
    ssize_t rc = fi_send(ep_, bytes, length, nullptr, to, &send_ctx_.ctx);
    if (rc == 0) return {};
    if (rc != -FI_EAGAIN) return fi_failure("fi_send", rc);
    fi_cq_msg_entry none[1];
    (void)fi_cq_read(cq_, none, 0);
  }
}

Status RawEndpoint::inject(fi_addr_t to, const void* bytes, size_t length) {
  RT_ASSERT(length <= info_->tx_attr->inject_size, length, info_->tx_attr->inject_size);
  for (;;) {
    ssize_t rc = fi_inject(ep_, bytes, length, to);
    if (rc == 0) return {};
    if (rc != -FI_EAGAIN) return fi_failure("fi_inject", rc);
    fi_cq_msg_entry none[1];
    (void)fi_cq_read(cq_, none, 0);
  }
}

Status RawEndpoint::read(fi_addr_t from, void* local, size_t length, uint64_t remote,
                         uint64_t key) {
  for (;;) {
    ssize_t rc = fi_read(ep_, local, length, local_desc_, from, remote, key, &read_ctx_.ctx);
    if (rc == 0) return {};
    if (rc != -FI_EAGAIN) return fi_failure("fi_read", rc);
    fi_cq_msg_entry none[1];
    (void)fi_cq_read(cq_, none, 0);
  }
}

Result<std::unique_ptr<fid_mr, void (*)(fid_mr*)>> RawEndpoint::register_memory(void* base,
                                                                                size_t len) {
  fid_mr* mr = nullptr;
  uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  int rc = fi_mr_reg(domain_, base, len, access, 0, 1, 0, &mr, nullptr);
  if (rc) return fi_failure("fi_mr_reg", rc);
  auto close = [](fid_mr* m) { fi_close(&m->fid); };
  std::unique_ptr<fid_mr, void (*)(fid_mr*)> owned(mr, close);
  if (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    rc = fi_mr_bind(mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc) return fi_failure("fi_mr_bind/enable", rc);
  }
  local_desc_ = fi_mr_desc(mr);
  return owned;
}

Result<long> RawEndpoint::next_completion(bool forever) {
  fi_cq_msg_entry entry;
  auto deadline = Clock::now() + completion_timeout;
  for (uint64_t spins = 0;; ++spins) {
    ssize_t n = fi_cq_read(cq_, &entry, 1);
    if (n == 1) return static_cast<Ctx*>(entry.op_context)->slot;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      (void)fi_cq_readerr(cq_, &err, 0);
      long slot = err.op_context ? static_cast<Ctx*>(err.op_context)->slot : -3;
      return fi_failure(("completion with error (slot " + std::to_string(slot) + ", " +
                         fi_cq_strerror(cq_, err.prov_errno, err.err_data, nullptr, 0) + ")")
                            .c_str(),
                        err.err);
    }
    if (n != -FI_EAGAIN) return fi_failure("fi_cq_read", n);
    if (yield_when_idle) sched_yield();
    if (!forever && (spins & 1023) == 0 && Clock::now() > deadline) {
      return make_error(ErrorKind::timed_out, "raw baseline: no completion within 10 s");
    }
  }
}

bool write_ready_file(const std::string& path, const std::string& line) {
  std::string temp = path + ".tmp";
  {
    std::ofstream out(temp);
    out << line;
    if (!out) return false;
  }
  return std::rename(temp.c_str(), path.c_str()) == 0;
}

// Polling also drives the provider's progress (FI_PROGRESS_MANUAL): the parent's one-sided
// reads are served only while this loop runs, so it waits without a deadline.
Status serve_loop(RawEndpoint& ep, fi_addr_t parent) {
  for (;;) {
    auto done = ep.next_completion(/*forever=*/true);
    if (!done.ok()) return done.error();
    if (*done < 0) continue;  // our own echo's send completion
    size_t slot = size_t(*done);
    char* bytes = ep.slot_bytes_at(slot);
    if (bytes[0] == 'q') return {};
    // Echo (the parent only sends messages of message_bytes); inject copies at once, so the
    // receive slot can be re-posted right away.
    Status s = ep.inject(parent, bytes, message_bytes);
    if (s.ok()) s = ep.post_recv(slot);
    if (!s.ok()) return s;
  }
}

}  // namespace

int serve_raw(const std::string& provider, const std::string& host, uint16_t port,
              const std::string& parent_address, const std::string& ready_path,
              uint64_t region_bytes) {
  RT_ASSERT(region_bytes > 0);
  RT_ASSERT(!ready_path.empty());
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the measuring parent
  RawEndpoint ep;
  std::vector<char> region(region_bytes, 'r');
  Status s = ep.open(provider, host, port);
  auto parent = s.ok() ? ep.insert(parent_address) : Result<fi_addr_t>(s.error());
  if (!parent.ok()) {
    std::fprintf(stderr, "%s\n", parent.error().describe().c_str());
    return 1;
  }
  auto mr = ep.register_memory(region.data(), region.size());
  if (!mr.ok()) {
    std::fprintf(stderr, "%s\n", mr.error().describe().c_str());
    return 1;
  }
  std::string line = std::to_string(ep.remote_base_of(region.data())) + " " +
                     std::to_string(region.size()) + " " + std::to_string(fi_mr_key(mr->get())) +
                     "\n";
  if (!write_ready_file(ready_path, line)) {
    std::fprintf(stderr, "raw baseline: cannot write %s\n", ready_path.c_str());
    return 1;
  }
  s = serve_loop(ep, *parent);
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.error().describe().c_str());
  return s.ok() ? 0 : 1;
}

namespace {

// One message out, its echo back; the send's own completion may come before or after.
Result<double> one_round_trip(RawEndpoint& ep, fi_addr_t child, const char* message) {
  RT_ASSERT(message != nullptr);
  RT_ASSERT(child != FI_ADDR_UNSPEC);
  auto t0 = Clock::now();
  if (Status s = ep.send(child, message, message_bytes); !s.ok()) return s.error();
  for (;;) {
    auto done = ep.next_completion();
    if (!done.ok()) return done.error();
    if (*done < 0) continue;
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (Status s = ep.post_recv(size_t(*done)); !s.ok()) return s.error();
    return us;
  }
}

// `total` messages with `window` outstanding; returns messages per second.
Result<double> windowed_rate(RawEndpoint& ep, fi_addr_t child, const char* message, uint32_t total,
                             uint32_t window) {
  RT_ASSERT(window > 0 && window < recv_slots_count, window);
  auto t0 = Clock::now();
  uint32_t sent = 0, received = 0;
  while (sent < window && sent < total) {
    if (Status s = ep.send(child, message, message_bytes); !s.ok()) return s.error();
    ++sent;
  }
  while (received < total) {
    auto done = ep.next_completion();
    if (!done.ok()) return done.error();
    if (*done < 0) continue;
    ++received;
    if (Status s = ep.post_recv(size_t(*done)); !s.ok()) return s.error();
    if (sent < total) {
      if (Status s = ep.send(child, message, message_bytes); !s.ok()) return s.error();
      ++sent;
    }
  }
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return double(total) / seconds;
}

// Back-to-back single fi_reads of `size` bytes, one outstanding; returns MB/s (10^6 B/s).
Result<double> read_loop(RawEndpoint& ep, fi_addr_t child, const RawRemote& remote,
                         std::vector<char>& local, uint64_t size, uint64_t total_bytes) {
  RT_ASSERT(size <= local.size() && size <= remote.length_bytes, size);
  uint64_t reps = std::max<uint64_t>(8, total_bytes / size);
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < reps; ++i) {
    Status s = ep.read(child, local.data(), size, remote.remote_base, remote.key);
    if (!s.ok()) return s.error();
    for (;;) {
      auto done = ep.next_completion();
      if (!done.ok()) return done.error();
      if (*done == -2) break;     // the read
      if (*done == -1) continue;  // a late send completion from the rate test
      if (Status p = ep.post_recv(size_t(*done)); !p.ok()) return p.error();
    }
  }
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return double(reps * size) / seconds / 1e6;
}

}  // namespace

Result<RawResults> measure_raw(const RawPlan& plan,
                               const std::function<Result<RawRemote>()>& start_child) {
  RT_ASSERT(plan.round_trips_count > 0 && plan.rate_messages_count > 0);
  RawEndpoint ep;
  if (Status s = ep.open(plan.provider, plan.host, plan.port); !s.ok()) return s.error();
  auto remote = start_child();
  if (!remote.ok()) return remote.error();
  auto child = ep.insert(remote->address);
  if (!child.ok()) return child.error();
  std::vector<char> message(message_bytes, 'p');
  RawResults results;
  for (uint32_t i = 0; i < plan.round_trips_count + plan.round_trips_count / 10; ++i) {
    auto us = one_round_trip(ep, *child, message.data());
    if (!us.ok()) return us.error();
    if (i >= plan.round_trips_count / 10) results.round_trip_us.push_back(*us);  // warm-up
  }
  auto rate =
      windowed_rate(ep, *child, message.data(), plan.rate_messages_count, plan.window_count);
  if (!rate.ok()) return rate.error();
  results.rate_msg_per_s = *rate;
  uint64_t largest = 0;
  for (uint64_t size : plan.read_sizes_bytes) largest = std::max(largest, size);
  std::vector<char> local(largest, 0);
  auto mr = ep.register_memory(local.data(), local.size());
  if (!mr.ok()) return mr.error();
  for (uint64_t size : plan.read_sizes_bytes) {
    auto mb = read_loop(ep, *child, *remote, local, size, plan.read_bytes_per_size);
    if (!mb.ok()) return mb.error();
    results.read_mb_per_s.push_back(*mb);
  }
  message[0] = 'q';
  if (Status s = ep.send(*child, message.data(), message_bytes); !s.ok()) return s.error();
  (void)ep.next_completion();  // the quit message's send completion
  return results;
}

}  // namespace tandem::bench
