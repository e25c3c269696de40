#include "runtime/node/diagnostics.hpp"

#include <charconv>
#include <cstring>

#include "runtime/node/bridge.hpp"

namespace tandem::runtime {

using messages::ActorName;

uint64_t checksum64(const std::byte* data, uint64_t length_bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  uint64_t words = length_bytes / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, data + i * 8, 8);
    hash = (hash ^ w) * 0x100000001b3ull;
  }
  for (uint64_t i = words * 8; i < length_bytes; ++i) {
    hash = (hash ^ static_cast<uint8_t>(data[i])) * 0x100000001b3ull;
  }
  return hash;
}

void fill_pattern(std::byte* data, uint64_t length_bytes, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint64_t i = 0; i < length_bytes; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(data + i, &x, std::min<uint64_t>(8, length_bytes - i));
  }
}

namespace {

std::optional<uint64_t> parse_u64(const std::string& text) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

AdminResult failure(std::string text) { return AdminResult{false, std::move(text) + "\n", {}}; }

}  // namespace

Diagnostics::Diagnostics(Bridge* bridge, Reply reply, PostReadDone post)
    : bridge_(bridge), reply_(std::move(reply)), post_(std::move(post)) {
  RT_ASSERT(bridge_ != nullptr);
  RT_ASSERT(reply_ && post_);
}

Diagnostics::~Diagnostics() = default;

void Diagnostics::ping(const AdminCaller& caller, const std::vector<std::string>& args) {
  if (args.size() != 1) return reply_(caller, failure("usage: ping NODE|NODE/ROLE/INSTANCE"));
  ActorName target{args[0], "node", ""};
  if (args[0].find('/') != std::string::npos) {
    auto parsed = ActorName::parse(args[0]);
    if (!parsed.ok()) return reply_(caller, failure(parsed.error().message));
    target = *parsed;
  }
  if (pings_.size() >= pings_pending_max) return reply_(caller, failure("too many pings pending"));
  uint64_t token = next_token_++;
  Status sent = bridge_->send({bridge_->node(), "node", ""}, target, token,
                              [&](wire::Envelope::Builder b) { b.getBody().initPing().setNonce(token); });
  if (!sent.ok()) return reply_(caller, failure("ping " + args[0] + ": " + sent.error().describe()));
  pings_[token] = PendingPing{caller, target.to_string(), std::chrono::steady_clock::now()};
}

void Diagnostics::on_pong(uint64_t correlation) {
  auto it = pings_.find(correlation);
  if (it == pings_.end()) return;  // late or unknown
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                        it->second.start)
                  .count();
  char text[128];
  std::snprintf(text, sizeof(text), "%.1f", us);
  reply_(it->second.caller,
         AdminResult{true, bridge_->node() + " -> " + it->second.target + ": " + text + " us\n",
                     {{"from", "to", "rtt_us"}, {bridge_->node(), it->second.target, text}}});
  pings_.erase(it);
}

void Diagnostics::expire(std::chrono::steady_clock::time_point now) {
  for (auto it = pings_.begin(); it != pings_.end();) {
    if (now - it->second.start > std::chrono::seconds(2)) {
      reply_(it->second.caller, failure("ping " + it->second.target + ": no answer within 2 s"));
      it = pings_.erase(it);
    } else {
      ++it;
    }
  }
}

void Diagnostics::rma_expose(const AdminCaller& caller, const std::vector<std::string>& args) {
  auto bytes = args.size() == 1 ? parse_u64(args[0]) : std::nullopt;
  if (!bytes || *bytes == 0) return reply_(caller, failure("usage: rma-expose BYTES (> 0)"));
  if (exposed_.size() >= regions_max || region_bytes_total_ + *bytes > region_bytes_total_max) {
    return reply_(caller, failure("too many exposed regions (release some with rma-release)"));
  }
  Region region;
  region.bytes.resize(*bytes);
  uint64_t seed = next_token_++;
  fill_pattern(region.bytes.data(), *bytes, seed);
  auto registered = bridge_->fabric()->register_memory(region.bytes.data(), *bytes);
  if (!registered.ok()) return reply_(caller, failure(registered.error().describe()));
  region.registration = std::move(registered).value();
  uint64_t key = region.registration->key();
  uint64_t checksum = checksum64(region.bytes.data(), *bytes);
  std::vector<std::string> row = {bridge_->node(), std::to_string(region.registration->remote_base()),
                                  std::to_string(*bytes), std::to_string(key),
                                  std::to_string(checksum)};
  region_bytes_total_ += *bytes;
  exposed_.emplace(key, std::move(region));
  reply_(caller, AdminResult{true,
                             "exposed " + row[2] + " bytes: base " + row[1] + " key " + row[3] +
                                 " checksum " + row[4] + "\n",
                             {{"node", "base", "bytes", "key", "checksum"}, row}});
}

void Diagnostics::rma_release(const AdminCaller& caller, const std::vector<std::string>& args) {
  auto key = args.size() == 1 ? parse_u64(args[0]) : std::nullopt;
  auto it = key ? exposed_.find(*key) : exposed_.end();
  if (it == exposed_.end()) return reply_(caller, failure("usage: rma-release KEY (an exposed key)"));
  region_bytes_total_ -= it->second.bytes.size();
  exposed_.erase(it);
  reply_(caller, AdminResult{true, "released\n", {}});
}

void Diagnostics::rma_read(const AdminCaller& caller, const std::vector<std::string>& args) {
  std::optional<uint64_t> base, length, key;
  if (args.size() == 4) base = parse_u64(args[1]), length = parse_u64(args[2]), key = parse_u64(args[3]);
  if (!base || !length || !key || *length == 0) {
    return reply_(caller, failure("usage: rma-read NODE BASE BYTES KEY"));
  }
  if (reads_.size() >= regions_max || region_bytes_total_ + *length > region_bytes_total_max) {
    return reply_(caller, failure("too many RMA reads in progress"));
  }
  auto address = bridge_->address_of(args[0]);
  if (!address.ok()) return reply_(caller, failure(address.error().describe()));
  auto peer = bridge_->fabric()->peer(*address);
  if (!peer.ok()) return reply_(caller, failure(peer.error().describe()));
  PendingRead read{caller, {}, std::chrono::steady_clock::now()};
  read.region.bytes.resize(*length);
  auto registered = bridge_->fabric()->register_memory(read.region.bytes.data(), *length);
  if (!registered.ok()) return reply_(caller, failure(registered.error().describe()));
  read.region.registration = std::move(registered).value();
  uint64_t token = next_token_++;
  RemoteRegionRef remote{*base, *length, *key};
  const MemoryRegion& local = *read.region.registration;
  region_bytes_total_ += *length;
  auto [it, inserted] = reads_.emplace(token, std::move(read));
  RT_ASSERT(inserted, token);
  PostReadDone post = post_;
  Status started = bridge_->fabric()->read(*peer, remote, 0, local, 0, *length,
                                           [post, token](Status s) {
                                             post(RmaReadDone{token, s.ok(),
                                                              s.ok() ? "" : s.error().describe()});
                                           });
  if (!started.ok()) on_read_done(RmaReadDone{token, false, started.error().describe()});
}

void Diagnostics::on_read_done(const RmaReadDone& done) {
  auto it = reads_.find(done.token);
  RT_ASSERT(it != reads_.end(), done.token);
  PendingRead read = std::move(it->second);
  reads_.erase(it);
  region_bytes_total_ -= read.region.bytes.size();
  if (!done.ok) return reply_(read.caller, failure("RMA read failed: " + done.error));
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - read.start).count();
  uint64_t size = read.region.bytes.size();
  uint64_t checksum = checksum64(read.region.bytes.data(), size);
  char rate[64];
  std::snprintf(rate, sizeof(rate), "%.3f", size / seconds / 1e9);
  std::vector<std::string> row = {std::to_string(size), std::to_string(checksum),
                                  std::to_string(static_cast<uint64_t>(seconds * 1e6)), rate};
  reply_(read.caller, AdminResult{true,
                                  "read " + row[0] + " bytes in " + row[2] + " us (" + rate +
                                      " GB/s), checksum " + row[1] + "\n",
                                  {{"bytes", "checksum", "micros", "gb_per_s"}, row}});
}

}  // namespace tandem::runtime
