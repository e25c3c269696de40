#include "runtime/fabric/secure_channel.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstring>

namespace tandem::runtime {

namespace {

constexpr uint8_t kMagic0 = 'T', kMagic1 = 'D', kVersion = 1;
constexpr uint8_t kInit = 0x01, kResp = 0x02, kConfirm = 0x03, kData = 0x10;
constexpr size_t kNonceBytes = 32, kMacBytes = 32, kNameMax = 64, kAddressMax = 128;
using Mac = std::array<uint8_t, kMacBytes>;
using Key32 = std::array<uint8_t, 32>;

// Little-endian writer/reader over bytes; the reader fails (ok = false) past the end.
class Writer {
 public:
  explicit Writer(uint8_t type) { bytes_ = {kMagic0, kMagic1, kVersion, type}; }
  void u8(uint8_t v) { bytes_.push_back(v); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void raw(std::span<const uint8_t> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  void text(std::string_view t) {  // u8 length, bytes (asserted short)
    RT_ASSERT(t.size() <= 255, t.size());
    u8(static_cast<uint8_t>(t.size()));
    bytes_.insert(bytes_.end(), t.begin(), t.end());
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b), at_(4) {}
  bool ok() const { return ok_; }
  size_t offset() const { return at_; }
  uint8_t u8() { return need(1) ? b_[at_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    if (!need(4)) return 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{b_[at_++]} << (8 * i);
    return v;
  }
  uint64_t u64() {
    uint64_t v = 0;
    if (!need(8)) return 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{b_[at_++]} << (8 * i);
    return v;
  }
  std::span<const uint8_t> raw(size_t n) {
    if (!need(n)) return {};
    auto out = b_.subspan(at_, n);
    at_ += n;
    return out;
  }
  std::string_view text(size_t max) {
    size_t n = u8();
    if (n > max) ok_ = false;
    auto r = raw(ok_ ? n : 0);
    return {reinterpret_cast<const char*>(r.data()), r.size()};
  }
  bool at_end() const { return ok_ && at_ == b_.size(); }

 private:
  bool need(size_t n) {
    if (!ok_ || b_.size() - at_ < n) ok_ = false;
    return ok_;
  }
  std::span<const uint8_t> b_;
  size_t at_;
  bool ok_ = true;
};

std::span<const uint8_t> u8s(std::span<const std::byte> b) {
  return {reinterpret_cast<const uint8_t*>(b.data()), b.size()};
}

std::vector<std::byte> to_bytes(const std::vector<uint8_t>& v) {
  std::vector<std::byte> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size());
  return out;
}

// HMAC-SHA-256 of the concatenation of `parts` under `key`.
Mac hmac(std::span<const uint8_t> key, std::initializer_list<std::span<const uint8_t>> parts) {
  std::vector<uint8_t> data;
  for (auto p : parts) data.insert(data.end(), p.begin(), p.end());
  Mac out{};
  unsigned len = 0;
  uint8_t* r = HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), data.data(),
                    data.size(), out.data(), &len);
  RT_ASSERT(r != nullptr && len == kMacBytes, "HMAC-SHA-256 failed");
  return out;
}

std::span<const uint8_t> label(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// The cluster name as it enters a MAC: length-prefixed, so names cannot run into the data.
std::vector<uint8_t> cluster_tag(const std::string& cluster) {
  std::vector<uint8_t> out(2 + cluster.size());
  out[0] = static_cast<uint8_t>(cluster.size() & 0xff);
  out[1] = static_cast<uint8_t>(cluster.size() >> 8);
  if (!cluster.empty()) std::memcpy(out.data() + 2, cluster.data(), cluster.size());
  return out;
}

bool mac_equal(std::span<const uint8_t> a, const Mac& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), b.size()) == 0;
}

void random_bytes(std::span<uint8_t> out) {
  RT_ASSERT(RAND_bytes(out.data(), static_cast<int>(out.size())) == 1, "RAND_bytes failed");
}

bool valid_peer_name(std::string_view name) {
  if (name.empty() || name.size() > kNameMax || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  });
}

EVP_CIPHER_CTX* make_aead(const Key32& key, bool encrypt) {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  RT_ASSERT(ctx != nullptr);
  int ok = encrypt ? EVP_EncryptInit_ex(ctx, EVP_chacha20_poly1305(), nullptr, key.data(), nullptr)
                   : EVP_DecryptInit_ex(ctx, EVP_chacha20_poly1305(), nullptr, key.data(), nullptr);
  RT_ASSERT(ok == 1, "ChaCha20-Poly1305 key setup failed");
  return ctx;
}

std::array<uint8_t, 12> nonce_of(uint8_t lane, uint64_t seq) {
  std::array<uint8_t, 12> iv{};
  iv[0] = lane;
  for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<uint8_t>(seq >> (8 * i));
  return iv;
}

}  // namespace

std::string_view to_string(PeerClass c) { return c == PeerClass::node ? "node" : "client"; }
std::string_view to_string(KeyRole r) { return r == KeyRole::cluster ? "cluster" : "admin"; }

std::string_view to_string(ChannelDrop d) {
  switch (d) {
    case ChannelDrop::not_sealed: return "not_sealed";
    case ChannelDrop::malformed: return "malformed";
    case ChannelDrop::unknown_key: return "unknown_key";
    case ChannelDrop::bad_mac: return "bad_mac";
    case ChannelDrop::refused: return "refused";
    case ChannelDrop::stale: return "stale";
    case ChannelDrop::unknown_session: return "unknown_session";
    case ChannelDrop::bad_tag: return "bad_tag";
    case ChannelDrop::replayed: return "replayed";
    case ChannelDrop::kinds_count: break;
  }
  return "?";
}

uint32_t ChannelKey::id() const {
  constexpr std::string_view tag = "tandem key id";
  std::vector<uint8_t> data(tag.size() + secret.size());
  std::memcpy(data.data(), tag.data(), tag.size());
  if (!secret.empty()) std::memcpy(data.data() + tag.size(), secret.data(), secret.size());
  uint8_t digest[SHA256_DIGEST_LENGTH];
  SHA256(data.data(), data.size(), digest);
  return uint32_t{digest[0]} | uint32_t{digest[1]} << 8 | uint32_t{digest[2]} << 16 |
         uint32_t{digest[3]} << 24;
}

std::string sanitize_peer_text(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  for (char c : text.substr(0, max_bytes)) {
    auto u = static_cast<unsigned char>(c);
    out.push_back(u >= 0x20 && u < 0x7f ? c : '?');
  }
  if (text.size() > max_bytes) out += "...";
  return out;
}

class ChannelSession {
 public:
  ChannelSession(uint64_t local, uint64_t remote, std::shared_ptr<const PeerIdentity> peer,
                 const Key32& tx, const Key32& rx, ChannelClock::time_point created)
      : local_id(local),
        remote_id(remote),
        peer(std::move(peer)),
        created(created),
        tx_ctx(make_aead(tx, true)),
        rx_ctx(make_aead(rx, false)) {}
  ~ChannelSession() {
    EVP_CIPHER_CTX_free(tx_ctx);
    EVP_CIPHER_CTX_free(rx_ctx);
  }
  ChannelSession(const ChannelSession&) = delete;
  ChannelSession& operator=(const ChannelSession&) = delete;

  const uint64_t local_id, remote_id;
  const std::shared_ptr<const PeerIdentity> peer;
  const ChannelClock::time_point created;
  std::mutex tx_mu;
  EVP_CIPHER_CTX* const tx_ctx;
  std::array<uint64_t, 2> tx_seq{0, 0};  // last sealed, per lane (tx_mu)
  std::mutex rx_mu;
  EVP_CIPHER_CTX* const rx_ctx;
  std::array<uint64_t, 2> rx_seq{0, 0};  // last opened, per lane (rx_mu)
};

struct SecureChannel::Initiation {
  std::string address;
  uint64_t session_id = 0;
  uint32_t key_id = 0;
  std::vector<uint8_t> init;  // the INIT as sent
  ChannelClock::time_point created, last_sent;
};

struct SecureChannel::Response {
  uint64_t session_id = 0, initiator_id = 0;
  uint32_t key_id = 0;
  std::vector<uint8_t> init, resp;  // the transcript so far
  std::shared_ptr<const PeerIdentity> peer;
  ChannelClock::time_point created;
};

SecureChannel::SecureChannel(ChannelConfig config) : config_(std::move(config)) {
  RT_ASSERT(!config_.keys.empty(), "a secure channel needs a key");
  RT_ASSERT(valid_peer_name(config_.self_name), config_.self_name);
  RT_ASSERT(config_.cluster.size() <= 255 && !config_.cluster.empty(), config_.cluster);
  for (const auto& k : config_.keys) {
    RT_ASSERT(k.secret.size() >= channel_key_bytes_min && k.secret.size() <= channel_key_bytes_max,
              k.secret.size());
  }
  RT_ASSERT(config_.pending_max > 0 && config_.sessions_max > 0 &&
            config_.sessions_per_peer_max > 0);
  while (config_.incarnation == 0) {
    random_bytes({reinterpret_cast<uint8_t*>(&config_.incarnation), sizeof config_.incarnation});
  }
}

SecureChannel::~SecureChannel() = default;

void SecureChannel::set_self_address(std::string address) {
  std::lock_guard lock(mu_);
  RT_ASSERT(address.size() <= kAddressMax, address);
  config_.self_address = std::move(address);
}

const ChannelKey* SecureChannel::key_by_id(uint32_t id) const {
  for (const auto& k : config_.keys) {
    if (k.id() == id) return &k;
  }
  return nullptr;
}

uint64_t SecureChannel::fresh_session_id() {
  for (;;) {
    uint64_t id = 0;
    random_bytes({reinterpret_cast<uint8_t*>(&id), sizeof id});
    if (id != 0 && !sessions_.count(id) && !initiations_.count(id) && !responses_.count(id)) {
      return id;
    }
  }
}

std::vector<std::byte> SecureChannel::initiate(const std::string& address,
                                               ChannelClock::time_point now,
                                               std::chrono::milliseconds resend_after) {
  std::lock_guard lock(mu_);
  for (auto& [id, in] : initiations_) {
    if (in->address != address) continue;
    if (now - in->last_sent < resend_after) return {};
    in->last_sent = now;
    return to_bytes(in->init);
  }
  RT_ASSERT(!config_.self_address.empty(), "initiate before the endpoint's address is known");
  if (initiations_.size() >= config_.pending_max) {  // drop the oldest
    auto oldest = std::min_element(initiations_.begin(), initiations_.end(),
                                   [](const auto& a, const auto& b) {
                                     return a.second->created < b.second->created;
                                   });
    initiations_.erase(oldest);
  }
  auto in = std::make_unique<Initiation>();
  in->address = address;
  in->session_id = fresh_session_id();
  const ChannelKey& key = config_.keys.front();
  in->key_id = key.id();
  std::array<uint8_t, kNonceBytes> nonce{};
  random_bytes(nonce);
  Writer w(kInit);
  w.u32(in->key_id);
  w.u64(in->session_id);
  w.raw(nonce);
  w.u8(static_cast<uint8_t>(config_.self_class));
  w.u64(config_.incarnation);
  w.text(config_.self_name);
  w.text(config_.self_address);
  Mac mac = hmac(key.secret, {label("tandem/1 init"), cluster_tag(config_.cluster), w.bytes()});
  w.raw(mac);
  in->init = std::move(w.bytes());
  in->created = in->last_sent = now;
  auto out = to_bytes(in->init);
  initiations_.emplace(in->session_id, std::move(in));
  RT_ASSERT(initiations_.size() <= config_.pending_max);
  return out;
}

bool SecureChannel::initiating(const std::string& address) const {
  std::lock_guard lock(mu_);
  return std::any_of(initiations_.begin(), initiations_.end(),
                     [&](const auto& e) { return e.second->address == address; });
}

SecureChannel::Received SecureChannel::on_frame(std::span<std::byte> frame,
                                                ChannelClock::time_point now) {
  Received dropped;
  auto b = u8s(frame);
  if (b.size() < 4 || b[0] != kMagic0 || b[1] != kMagic1 || b[2] != kVersion) return dropped;
  switch (b[3]) {
    case kInit: return on_init(frame, now);
    case kResp: return on_resp(frame, now);
    case kConfirm: return on_confirm(frame, now);
    case kData | 0:
    case kData | 1: return open(frame, b[3] & 1);
    default: return dropped;
  }
}

namespace {

SecureChannel::Received drop(ChannelDrop why, std::string hint = {}) {
  SecureChannel::Received r;
  r.kind = SecureChannel::Received::Kind::dropped;
  r.reason = why;
  r.peer_hint = std::move(hint);
  return r;
}

// Session keys from the key and the transcript: (initiator -> responder, responder -> initiator).
std::pair<Key32, Key32> session_keys(const ChannelKey& key, const std::string& cluster,
                                     std::span<const uint8_t> init, std::span<const uint8_t> resp) {
  Mac secret = hmac(key.secret, {label("tandem/1 session"), cluster_tag(cluster), init, resp});
  Mac i2r = hmac(secret, {label("initiator to responder")});
  Mac r2i = hmac(secret, {label("responder to initiator")});
  return {i2r, r2i};
}

}  // namespace

SecureChannel::Received SecureChannel::on_init(std::span<const std::byte> frame,
                                               ChannelClock::time_point now) {
  auto b = u8s(frame);
  if (b.size() > handshake_bytes_max) return drop(ChannelDrop::malformed);
  Reader r(b);
  uint32_t key_id = r.u32();
  uint64_t initiator_id = r.u64();
  (void)r.raw(kNonceBytes);
  uint8_t cls = r.u8();
  uint64_t incarnation = r.u64();
  std::string_view name = r.text(kNameMax);
  std::string_view address = r.text(kAddressMax);
  size_t body_bytes = r.offset();
  auto mac = r.raw(kMacBytes);
  if (!r.at_end() || initiator_id == 0 || (cls != 1 && cls != 2)) {
    return drop(ChannelDrop::malformed);
  }
  std::string hint = sanitize_peer_text(name, kNameMax) + "@" +
                     sanitize_peer_text(address, kAddressMax);
  // Keys and admit are fixed at construction: checked without the lock (admit may take the
  // caller's own locks, which are taken before ours on the sending side).
  const ChannelKey* key = key_by_id(key_id);
  if (key == nullptr) return drop(ChannelDrop::unknown_key, hint);
  Mac want = hmac(key->secret, {label("tandem/1 init"), cluster_tag(config_.cluster),
                                b.subspan(0, body_bytes)});
  if (!mac_equal(mac, want)) return drop(ChannelDrop::bad_mac, hint);
  PeerClaim claim{std::string(name), static_cast<PeerClass>(cls), key->role, std::string(address)};
  if (!valid_peer_name(claim.name) || (claim.key_role == KeyRole::admin &&
                                       claim.peer_class != PeerClass::client)) {
    return drop(ChannelDrop::refused, hint);
  }
  auto answer_at = config_.admit ? config_.admit(claim) : Result<std::string>(Error{});
  if (!answer_at.ok()) return drop(ChannelDrop::refused, hint);
  std::lock_guard lock(mu_);
  if (responses_.size() >= config_.pending_max) {
    auto oldest = std::min_element(responses_.begin(), responses_.end(), [](auto& x, auto& y) {
      return x.second->created < y.second->created;
    });
    responses_.erase(oldest);
  }
  auto resp = std::make_unique<Response>();
  resp->session_id = fresh_session_id();
  resp->initiator_id = initiator_id;
  resp->key_id = key_id;
  resp->init.assign(b.begin(), b.end());
  resp->created = now;
  resp->peer = std::make_shared<const PeerIdentity>(PeerIdentity{
      claim.name, claim.peer_class, claim.key_role, key_id, *answer_at, incarnation});
  std::array<uint8_t, kNonceBytes> nonce{};
  random_bytes(nonce);
  Writer w(kResp);
  w.u32(key_id);
  w.u64(initiator_id);
  w.u64(resp->session_id);
  w.raw(nonce);
  w.u8(static_cast<uint8_t>(config_.self_class));
  w.u64(config_.incarnation);
  w.text(config_.self_name);
  Mac resp_mac = hmac(key->secret, {label("tandem/1 resp"), cluster_tag(config_.cluster),
                                    resp->init, w.bytes()});
  w.raw(resp_mac);
  resp->resp = std::move(w.bytes());
  Received out;
  out.kind = Received::Kind::handshake;
  out.reply_address = *answer_at;
  out.reply = to_bytes(resp->resp);
  responses_.emplace(resp->session_id, std::move(resp));
  RT_ASSERT(responses_.size() <= config_.pending_max);
  return out;
}

SecureChannel::Received SecureChannel::on_resp(std::span<const std::byte> frame,
                                               ChannelClock::time_point now) {
  auto b = u8s(frame);
  if (b.size() > handshake_bytes_max) return drop(ChannelDrop::malformed);
  Reader r(b);
  uint32_t key_id = r.u32();
  uint64_t initiator_id = r.u64();
  uint64_t responder_id = r.u64();
  (void)r.raw(kNonceBytes);
  uint8_t cls = r.u8();
  uint64_t incarnation = r.u64();
  std::string_view name = r.text(kNameMax);
  size_t body_bytes = r.offset();
  auto mac = r.raw(kMacBytes);
  if (!r.at_end() || responder_id == 0 || (cls != 1 && cls != 2)) {
    return drop(ChannelDrop::malformed);
  }
  std::string hint = sanitize_peer_text(name, kNameMax);
  Initiation in;  // a copy: admit runs without the lock
  {
    std::lock_guard lock(mu_);
    auto it = initiations_.find(initiator_id);
    if (it == initiations_.end()) return drop(ChannelDrop::stale, hint);
    in = *it->second;
  }
  const ChannelKey* key = key_by_id(in.key_id);
  if (key == nullptr || key_id != in.key_id) return drop(ChannelDrop::bad_mac, hint);
  Mac want = hmac(key->secret, {label("tandem/1 resp"), cluster_tag(config_.cluster), in.init,
                                b.subspan(0, body_bytes)});
  if (!mac_equal(mac, want)) return drop(ChannelDrop::bad_mac, hint);
  PeerClaim claim{std::string(name), static_cast<PeerClass>(cls), key->role, in.address};
  auto at = config_.admit && valid_peer_name(claim.name) ? config_.admit(claim)
                                                          : Result<std::string>(Error{});
  // The peer answered as someone who does not live at the address we called: refuse.
  if (!at.ok() || *at != in.address) return drop(ChannelDrop::refused, hint + "@" + in.address);
  auto [i2r, r2i] = session_keys(*key, config_.cluster, in.init, b);
  Writer w(kConfirm);
  w.u64(responder_id);
  w.u64(initiator_id);
  Mac confirm_mac = hmac(key->secret, {label("tandem/1 confirm"), cluster_tag(config_.cluster),
                                       in.init, b, w.bytes()});
  w.raw(confirm_mac);
  auto peer = std::make_shared<const PeerIdentity>(
      PeerIdentity{claim.name, claim.peer_class, key->role, key_id, in.address, incarnation});
  std::lock_guard lock(mu_);
  if (initiations_.erase(initiator_id) == 0) return drop(ChannelDrop::stale, hint);  // raced
  add_session(std::make_shared<ChannelSession>(initiator_id, responder_id, std::move(peer), i2r,
                                               r2i, now));
  Received out;
  out.kind = Received::Kind::handshake;
  out.reply_address = in.address;
  out.reply = to_bytes(w.bytes());
  out.established_address = in.address;
  return out;
}

SecureChannel::Received SecureChannel::on_confirm(std::span<const std::byte> frame,
                                                  ChannelClock::time_point now) {
  auto b = u8s(frame);
  Reader r(b);
  uint64_t responder_id = r.u64();
  uint64_t initiator_id = r.u64();
  size_t body_bytes = r.offset();
  auto mac = r.raw(kMacBytes);
  if (!r.at_end()) return drop(ChannelDrop::malformed);
  std::unique_lock lock(mu_);
  auto it = responses_.find(responder_id);
  if (it == responses_.end() || it->second->initiator_id != initiator_id) {
    return drop(ChannelDrop::stale);
  }
  Response& resp = *it->second;
  std::string hint = resp.peer->name + "@" + resp.peer->address;
  const ChannelKey* key = key_by_id(resp.key_id);
  if (key == nullptr) return drop(ChannelDrop::unknown_key, hint);  // rotated away meanwhile
  Mac want = hmac(key->secret, {label("tandem/1 confirm"), cluster_tag(config_.cluster),
                                resp.init, resp.resp, b.subspan(0, body_bytes)});
  if (!mac_equal(mac, want)) return drop(ChannelDrop::bad_mac, hint);
  auto [i2r, r2i] = session_keys(*key, config_.cluster, resp.init, resp.resp);
  add_session(std::make_shared<ChannelSession>(responder_id, initiator_id, resp.peer, r2i, i2r,
                                               now));
  Received out;
  out.kind = Received::Kind::handshake;
  out.established_address = resp.peer->address;
  responses_.erase(it);
  return out;
}

void SecureChannel::add_session(std::shared_ptr<ChannelSession> session) {
  const std::string& address = session->peer->address;
  uint64_t id = session->local_id;
  sessions_.emplace(id, std::move(session));
  session_order_.push_back(id);
  // Per peer: keep the newest few (a restarted peer's new session and the old one's last
  // frames; a simultaneous open from both sides).
  size_t of_peer = 0;
  for (auto at = session_order_.rbegin(); at != session_order_.rend(); ++at) {
    auto s = sessions_.find(*at);
    if (s == sessions_.end() || s->second->peer->address != address) continue;
    if (++of_peer > config_.sessions_per_peer_max) sessions_.erase(s);
  }
  while (sessions_.size() > config_.sessions_max && !session_order_.empty()) {
    sessions_.erase(session_order_.front());
    session_order_.pop_front();
  }
  // The order list only grows by one per session: drop ids that are gone from its front.
  while (!session_order_.empty() && !sessions_.count(session_order_.front())) {
    session_order_.pop_front();
  }
  if (session_order_.size() > 2 * size_t{config_.sessions_max} + 16) {
    std::erase_if(session_order_, [this](uint64_t x) { return !sessions_.count(x); });
  }
  RT_ASSERT(sessions_.size() <= config_.sessions_max, sessions_.size());
}

std::shared_ptr<ChannelSession> SecureChannel::session_for(const std::string& address) const {
  std::lock_guard lock(mu_);
  for (auto at = session_order_.rbegin(); at != session_order_.rend(); ++at) {
    auto s = sessions_.find(*at);
    if (s != sessions_.end() && s->second->peer->address == address) return s->second;
  }
  return nullptr;
}

const PeerIdentity& SecureChannel::peer_of(const ChannelSession& session) { return *session.peer; }
uint64_t SecureChannel::id_of(const ChannelSession& session) { return session.local_id; }

std::vector<std::byte> SecureChannel::seal(ChannelSession& s, Lane lane,
                                           std::span<const std::byte> plaintext) {
  RT_ASSERT(plaintext.size() <= (1u << 31), plaintext.size());
  auto l = static_cast<uint8_t>(lane);
  std::vector<std::byte> out(header_bytes + plaintext.size() + tag_bytes);
  auto* o = reinterpret_cast<uint8_t*>(out.data());
  std::lock_guard lock(s.tx_mu);
  uint64_t seq = ++s.tx_seq[l];
  o[0] = kMagic0;
  o[1] = kMagic1;
  o[2] = kVersion;
  o[3] = static_cast<uint8_t>(kData | l);
  for (int i = 0; i < 8; ++i) o[4 + i] = static_cast<uint8_t>(s.remote_id >> (8 * i));
  for (int i = 0; i < 8; ++i) o[12 + i] = static_cast<uint8_t>(seq >> (8 * i));
  auto iv = nonce_of(l, seq);
  int len = 0;
  bool ok = EVP_EncryptInit_ex(s.tx_ctx, nullptr, nullptr, nullptr, iv.data()) == 1 &&
            EVP_EncryptUpdate(s.tx_ctx, nullptr, &len, o, header_bytes) == 1 &&
            EVP_EncryptUpdate(s.tx_ctx, o + header_bytes, &len,
                              reinterpret_cast<const uint8_t*>(plaintext.data()),
                              static_cast<int>(plaintext.size())) == 1 &&
            EVP_EncryptFinal_ex(s.tx_ctx, o + header_bytes + len, &len) == 1 &&
            EVP_CIPHER_CTX_ctrl(s.tx_ctx, EVP_CTRL_AEAD_GET_TAG, tag_bytes,
                                o + header_bytes + plaintext.size()) == 1;
  RT_ASSERT(ok, "ChaCha20-Poly1305 seal failed");
  return out;
}

SecureChannel::Received SecureChannel::open(std::span<std::byte> frame, uint8_t lane) {
  if (frame.size() < overhead_bytes) return drop(ChannelDrop::not_sealed);
  auto* f = reinterpret_cast<uint8_t*>(frame.data());
  uint64_t id = 0, seq = 0;
  for (int i = 0; i < 8; ++i) id |= uint64_t{f[4 + i]} << (8 * i);
  for (int i = 0; i < 8; ++i) seq |= uint64_t{f[12 + i]} << (8 * i);
  std::shared_ptr<ChannelSession> s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end()) s = it->second;
  }
  if (!s) return drop(ChannelDrop::unknown_session);
  auto hint = [&s] { return s->peer->name + "@" + s->peer->address; };  // on a drop only
  std::lock_guard lock(s->rx_mu);
  if (seq <= s->rx_seq[lane]) return drop(ChannelDrop::replayed, hint());
  size_t body = frame.size() - overhead_bytes;
  auto iv = nonce_of(lane, seq);
  int len = 0;
  uint8_t* text = f + header_bytes;
  bool ok = EVP_DecryptInit_ex(s->rx_ctx, nullptr, nullptr, nullptr, iv.data()) == 1 &&
            EVP_DecryptUpdate(s->rx_ctx, nullptr, &len, f, header_bytes) == 1 &&
            EVP_DecryptUpdate(s->rx_ctx, text, &len, text, static_cast<int>(body)) == 1 &&
            EVP_CIPHER_CTX_ctrl(s->rx_ctx, EVP_CTRL_AEAD_SET_TAG, tag_bytes, text + body) == 1 &&
            EVP_DecryptFinal_ex(s->rx_ctx, text + len, &len) > 0;
  if (!ok) return drop(ChannelDrop::bad_tag, hint());
  s->rx_seq[lane] = seq;
  Received out;
  out.kind = Received::Kind::data;
  out.plaintext = std::span<const std::byte>(frame.data() + header_bytes, body);
  out.from = s->peer;
  return out;
}

void SecureChannel::reset_peer(const std::string& address) {
  std::lock_guard lock(mu_);
  std::erase_if(initiations_, [&](const auto& e) { return e.second->address == address; });
  bool newest = true;
  for (auto at = session_order_.rbegin(); at != session_order_.rend(); ++at) {
    auto s = sessions_.find(*at);
    if (s == sessions_.end() || s->second->peer->address != address) continue;
    if (!newest) sessions_.erase(s);
    newest = false;
  }
}

std::vector<std::string> SecureChannel::expire(ChannelClock::time_point now) {
  std::lock_guard lock(mu_);
  std::vector<std::string> timed_out;
  for (auto it = initiations_.begin(); it != initiations_.end();) {
    if (now - it->second->created >= config_.handshake_timeout) {
      timed_out.push_back(it->second->address);
      it = initiations_.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(responses_, [&](const auto& e) {
    return now - e.second->created >= config_.handshake_timeout;
  });
  return timed_out;
}

size_t SecureChannel::sessions_count() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

size_t SecureChannel::pending_count() const {
  std::lock_guard lock(mu_);
  return initiations_.size() + responses_.size();
}

}  // namespace tandem::runtime
