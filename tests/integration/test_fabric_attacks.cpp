// A stranger on the same network as the cluster, knowing only a node's host and fabric port,
// with the project's own fabric library (no channel: plaintext frames, as a peer without the
// key would send them) and raw libfabric (RMA reads and writes with guessed keys). Each case
// is one of the attacks that used to work (issue 38): reading and writing KV memory, taking
// over a stream, driving the admin plane, killing streams with forged heartbeats, and sending
// work straight to decode. Then the same with the key, as a client that is not a node.
#include <doctest.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "messages/envelope.hpp"
#include "runtime/client/client.hpp"
#include "runtime/fabric/endpoint.hpp"
#include "runtime/node/credentials.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/serve_cluster.hpp"

using namespace tandem;
using namespace tandem::testing;
using namespace std::chrono_literals;

namespace {

// The project's fabric library without a channel: what a peer without the key can do.
class Stranger {
 public:
  Stranger() {
    runtime::FabricOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.frame_bytes_max = 4 << 20;
    o.recv_buffers = 8;
    auto opened = runtime::open_fabric(
        o, [this](std::span<const std::byte>, const runtime::PeerRef&) { ++received_; });
    if (!opened.ok()) FAIL(opened.error().describe());
    ep_ = std::move(opened).value();
  }
  runtime::FabricEndpoint& ep() { return *ep_; }
  uint64_t received() const { return received_.load(); }

  // One envelope as a member would send it, claiming to be `from`.
  void send(const std::string& to_address, const messages::ActorName& from,
            const messages::ActorName& to, uint64_t correlation,
            const std::function<void(wire::Envelope::Builder)>& fill) {
    capnp::MallocMessageBuilder message;
    auto e = message.initRoot<wire::Envelope>();
    e.setProtocolVersion(1);
    messages::set_name(e.initSource(), from);
    messages::set_name(e.initDestination(), to);
    e.setSourceAddress(ep_->address());
    e.setCorrelationId(correlation);
    e.setSourceIncarnation(0xbad);
    fill(e);
    auto words = messages::encode_frame(message);
    auto bytes = messages::frame_span(words);
    auto peer = ep_->peer(to_address);
    REQUIRE(peer.ok());
    CHECK(ep_->send(*peer, std::vector<std::byte>(bytes.begin(), bytes.end())).ok());
  }

  // A one-sided read of `length` bytes at offset 0 of the region under `key`; true when data
  // came back (the attack worked).
  bool blind_read(const std::string& address, uint64_t key, uint64_t length) {
    std::vector<std::byte> local(length);
    auto mr = ep_->register_memory(local.data(), local.size());
    REQUIRE(mr.ok());
    auto peer = ep_->peer(address);
    REQUIRE(peer.ok());
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Status> done;
    Status posted = ep_->read(*peer, runtime::RemoteRegionRef{0, length, key}, 0, **mr, 0, length,
                              [&](Status s) {
                                std::lock_guard lock(mu);
                                done = std::move(s);
                                cv.notify_all();
                              });
    if (!posted.ok()) return false;
    std::unique_lock lock(mu);
    bool answered = cv.wait_for(lock, 3s, [&] { return done.has_value(); });
    bool ok = answered && done->ok();
    lock.unlock();
    if (!answered) {
      // Unanswered: the read never completes; the endpoint must outlive it, so keep both.
      leaked_.push_back(std::move(local));
      leaked_regions_.push_back(std::move(mr).value());
    }
    return ok;
  }

  ~Stranger() {
    leaked_regions_.clear();
    ep_.reset();
  }

 private:
  std::unique_ptr<runtime::FabricEndpoint> ep_;
  std::atomic<uint64_t> received_{0};
  std::vector<std::vector<std::byte>> leaked_;
  std::vector<std::unique_ptr<runtime::MemoryRegion>> leaked_regions_;
};

// Raw libfabric: an fi_write of `bytes` into the region under `key` at `address`. True when it
// completed without error (the attack worked).
bool raw_blind_write(const std::string& address, uint64_t key, std::vector<uint8_t> bytes) {
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_RMA | FI_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", "0", FI_SOURCE, hints, &info);
  fi_freeinfo(hints);
  REQUIRE(rc == 0);
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  REQUIRE(fi_fabric(info->fabric_attr, &fabric, nullptr) == 0);
  REQUIRE(fi_domain(fabric, info, &domain, nullptr) == 0);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  cq_attr.wait_obj = FI_WAIT_NONE;
  REQUIRE(fi_cq_open(domain, &cq_attr, &cq, nullptr) == 0);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_MAP;
  REQUIRE(fi_av_open(domain, &av_attr, &av, nullptr) == 0);
  REQUIRE(fi_endpoint(domain, info, &ep, nullptr) == 0);
  REQUIRE(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) == 0);
  REQUIRE(fi_ep_bind(ep, &av->fid, 0) == 0);
  REQUIRE(fi_enable(ep) == 0);
  auto colon = address.rfind(':');
  fi_addr_t peer = FI_ADDR_UNSPEC;
  REQUIRE(fi_av_insertsvc(av, address.substr(0, colon).c_str(), address.substr(colon + 1).c_str(),
                          &peer, 0, nullptr) == 1);
  fi_context2 ctx{};
  bool written = false;
  ssize_t posted = -FI_EAGAIN;
  for (int i = 0; i < 1000 && posted == -FI_EAGAIN; ++i) {
    // Delivery complete: the completion reports what the target did with the write (a
    // transmit completion would only say the bytes left this host).
    iovec iov{bytes.data(), bytes.size()};
    fi_rma_iov rma{0, bytes.size(), key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.iov_count = 1;
    msg.addr = peer;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = &ctx;
    posted = fi_writemsg(ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
    if (posted == -FI_EAGAIN) (void)fi_cq_read(cq, nullptr, 0);
  }
  if (posted == 0) {
    auto deadline = std::chrono::steady_clock::now() + 3s;
    while (std::chrono::steady_clock::now() < deadline) {
      fi_cq_entry entry{};
      ssize_t n = fi_cq_read(cq, &entry, 1);
      if (n == 1) {
        written = true;
        break;
      }
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        (void)fi_cq_readerr(cq, &err, 0);
        break;
      }
      std::this_thread::sleep_for(1ms);
    }
  }
  fi_close(&ep->fid);
  fi_close(&av->fid);
  fi_close(&cq->fid);
  fi_close(&domain->fid);
  fi_close(&fabric->fid);
  fi_freeinfo(info);
  return written;
}

std::string address_of(ServeCluster& c, const std::string& node) {
  return "127.0.0.1:" + std::to_string(c.fabric_port(node));
}

// Guessed keys: the sequential ones that used to be handed out, and random ones.
std::vector<uint64_t> guessed_keys() {
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k <= 16; ++k) keys.push_back(k);
  std::mt19937_64 rng(42);
  for (int i = 0; i < 8; ++i) keys.push_back(rng());
  return keys;
}

void blind_rma_fails(ServeCluster& c) {
  Stranger stranger;
  const std::string prompt = "Once upon a time";
  auto before = complete(c.http_port(), prompt, 24);
  REQUIRE_MESSAGE(before.error.empty(), before.error);
  for (const auto& node : c.node_names()) {
    int reads = 0, writes = 0;
    for (uint64_t key : guessed_keys()) {
      reads += stranger.blind_read(address_of(c, node), key, 4096) ? 1 : 0;
      writes += raw_blind_write(address_of(c, node), key, std::vector<uint8_t>(4096, 0xee)) ? 1 : 0;
    }
    CHECK_MESSAGE(reads == 0, node, ": ", reads, " blind reads returned data");
    CHECK_MESSAGE(writes == 0, node, ": ", writes, " blind writes landed");
  }
  // Nothing cached was poisoned: the same prompt answers the same.
  auto after = complete(c.http_port(), prompt, 24);
  REQUIRE_MESSAGE(after.error.empty(), after.error, "\n", c.logs());
  CHECK(after.text == before.text);
}

void write_key(const std::string& path) {
  auto r = run({tandem_bin(), "keygen", path}, 10000ms);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
}

std::string requests_ids(ServeCluster& c) {
  auto r = c.shell("requests");
  return r.output;
}

}  // namespace

TEST_CASE("a stranger reads and writes no KV memory: blind RMA with guessed keys fails") {
  SUBCASE("the README's default: one host, no key named (the key made beside the state)") {
    ServeCluster c(Layout::loopback3, 1);
    REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
    blind_rma_fails(c);
  }
  SUBCASE("a keyed manifest") {
    std::string dir = make_temp_dir("keyed");
    write_key(dir + "/cluster.key");
    ServeCluster c(Layout::loopback3, 1, 0, "", "", "", false, true, "", "",
                   "key_file = \"" + dir + "/cluster.key\"\n");
    REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
    blind_rma_fails(c);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("a stranger's frames reach no actor: stream takeover, forged heartbeats, admin, work") {
  ServeCluster c(Layout::loopback3, 1, 0, "", "", "", false, true,
                 "time_factor = 10\noutput_tokens_mean = 160\noutput_tokens_sigma = 0\n"
                 "output_tokens_max = 160\n");
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  const std::string prompt = "Tom and Sue went to the park";
  auto reference = complete(c.http_port(), prompt, 160);
  REQUIRE_MESSAGE(reference.error.empty(), reference.error);
  double taken_before = c.metric("decode", "tandem:decode_requests_total");
  double refused_before = c.metric("front", "tandem:fabric_auth_failures_total");

  // The victim streams; the stranger, told its request id (the worst case: the id leaked),
  // answers for the router and for decode, forges decode's heartbeats, drains, asks decode
  // for work of its own and hellos every node.
  http::SseStream victim(c.http_port(), "/v1/completions",
                   completion_body(prompt, 160, true).dump(), 30000ms);
  REQUIRE(victim.ok());
  REQUIRE(victim.status() == 200);
  std::string streamed;
  auto first = victim.next(30000ms);
  REQUIRE(first.has_value());
  uint64_t id = 0;
  eventually(5000ms, [&] {
    auto rows = requests_ids(c);
    auto at = rows.find("front/gateway/gateway");
    if (at == std::string::npos) return false;
    std::istringstream line(rows.substr(at));
    std::string gw;
    line >> gw >> id;
    return id != 0;
  });
  Stranger stranger;
  messages::ActorName gateway{"front", "gateway", "gateway"};
  messages::ActorName router{"front", "router", "router"};
  messages::ActorName decode{"decode", "decode", "decode"};
  const int forged = 40;
  for (int i = 0; i < forged; ++i) {
    stranger.send(address_of(c, "front"), router, gateway, id, [&](wire::Envelope::Builder b) {
      auto r = b.getBody().initRouteReply();
      r.setDecodeInstance("decode/decode/decode");
    });
    stranger.send(address_of(c, "front"), decode, gateway, id, [&](wire::Envelope::Builder b) {
      auto t = b.getBody().initTokenChunk();
      t.setRequestId(id);
      t.setFirstIndex(0);
      t.initTokenIds(1).set(0, 42);
    });
    stranger.send(address_of(c, "front"), decode, gateway, id, [&](wire::Envelope::Builder b) {
      auto f = b.getBody().initFinish();
      f.setRequestId(id);
      f.setReason(wire::FinishReason::STOP);
    });
    stranger.send(address_of(c, "front"), {"decode", "node", ""}, {"front", "node", ""}, 0,
                  [&](wire::Envelope::Builder b) {
                    auto hb = b.getBody().initHeartbeat();
                    hb.setIncarnation(0xbad0000 + i);  // "restarted": would end its streams
                    hb.setSequence(1);
                    auto load = hb.initLoad(1);
                    load[0].setInstance("decode/decode/decode");
                    load[0].setReady(false);
                    load[0].setNotReadyReason("gone\n2026-12-07 00:00:00.000 [front] error: FORGED");
                  });
  }
  stranger.send(address_of(c, "decode"), {"stranger", "client", ""}, {"decode", "node", ""}, 7,
                [](wire::Envelope::Builder b) {
                  b.getBody().initAdminRequest().setCommand("drain");
                });
  stranger.send(address_of(c, "decode"), gateway, decode, 99, [](wire::Envelope::Builder b) {
    auto g = b.getBody().initGenerateRequest();
    g.setRequestId(99);
    g.initPromptTokenIds(3).set(0, 1);
    g.getLimits().setMaxTokens(50);
    g.setReplyTo("front/gateway/gateway");
  });
  for (const auto& node : c.node_names()) {
    stranger.send(address_of(c, node), {"stranger", "node", ""}, {node, "node", ""}, 1,
                  [](wire::Envelope::Builder b) {
                    auto h = b.getBody().initHello();
                    h.setNodeName("stranger");
                    h.setClusterName("serve-it");
                    h.setProtocolVersion(1);
                  });
  }
  // The victim's answer is its own, whole; a request meanwhile is served (no 503).
  auto meanwhile = complete(c.http_port(), "The little dog", 8);
  CHECK_MESSAGE(meanwhile.error.empty(), meanwhile.error);
  while (auto event = victim.next(30000ms)) {
    if (*event == "[DONE]") break;
    auto j = nlohmann::json::parse(*event, nullptr, false);
    if (j.contains("choices") && !j["choices"].empty()) {
      streamed += j["choices"][0].value("text", "");
    }
  }
  auto j0 = nlohmann::json::parse(*first, nullptr, false);
  std::string head = j0["choices"][0].value("text", "");
  CHECK(head + streamed == reference.text);
  // Nothing came back to the stranger, nothing was drained, no stranger joined.
  std::this_thread::sleep_for(300ms);
  CHECK(stranger.received() == 0);
  auto instances = c.shell("instances");
  CHECK(instances.output.find("draining") == std::string::npos);
  auto nodes = c.shell("nodes");
  CHECK(nodes.output.find("stranger") == std::string::npos);
  CHECK(table_row(nodes.output, "decode").find(" up") != std::string::npos);
  // Decode took only the two real requests (the victim's and the one meanwhile).
  CHECK(c.metric("decode", "tandem:decode_requests_total") - taken_before == 2);
  // Counted and logged once per interval, and no forged log line anywhere.
  double refused = c.metric("front", "tandem:fabric_auth_failures_total") - refused_before;
  CHECK(refused >= forged * 4);
  std::string logs = c.logs();
  CHECK(logs.find("refused a frame from an unknown peer: not_sealed") != std::string::npos);
  CHECK(logs.find("FORGED") == std::string::npos);
  CHECK(c.node("front").running());
  CHECK(c.node("decode").running());
}

TEST_CASE("with the key but not a node: a client cannot speak for a role, nor skip api_keys") {
  ServeCluster c(Layout::loopback3, 1, 0, "", "", "", false, true,
                 "time_factor = 0\noutput_tokens_mean = 20\noutput_tokens_sigma = 0\n");
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  auto loaded = config::load_manifest(c.manifest_path());
  REQUIRE(std::holds_alternative<config::Manifest>(loaded));
  const auto& manifest = std::get<config::Manifest>(loaded);
  auto client = runtime::ClusterClient::connect(manifest, "127.0.0.1");
  REQUIRE(client.ok());
  double taken_before = c.metric("decode", "tandem:decode_requests_total");
  double refused_before = c.metric("decode", "tandem:fabric_auth_failures_total",
                                   "reason=\"protocol\"");
  // A GenerateRequest straight to decode: no api key, no admission; refused unread.
  auto reply = (*client)->call({"decode", "decode", "decode"}, [](wire::Envelope::Builder b) {
    auto g = b.getBody().initGenerateRequest();
    g.setRequestId(1234);
    g.initPromptTokenIds(2).set(0, 1);
    g.getLimits().setMaxTokens(10);
    g.setReplyTo("front/gateway/gateway");
  }, 1500ms);
  CHECK_FALSE(reply.ok());
  // A route reply to the gateway from a client: refused too.
  auto route = (*client)->call({"front", "gateway", "gateway"}, [](wire::Envelope::Builder b) {
    b.getBody().initRouteReply().setDecodeInstance("decode/decode/decode");
  }, 500ms);
  CHECK_FALSE(route.ok());
  CHECK(c.metric("decode", "tandem:decode_requests_total") == taken_before);
  CHECK(c.metric("decode", "tandem:fabric_auth_failures_total", "reason=\"protocol\"") ==
        refused_before + 1);
  CHECK(c.metric("front", "tandem:fabric_auth_failures_total", "reason=\"protocol\"") >= 1);
  // With the key, speaking under another name: a heartbeat "from decode" on a client's own
  // session is dropped (the sender is the session's peer), and decode stays up.
  {
    auto channel = runtime::client_channel(manifest, "impostor-1");
    REQUIRE(channel.ok());
    runtime::FabricOptions o;
    o.host = "127.0.0.1";
    o.channel = std::move(channel).value();
    auto ep = runtime::open_fabric(o, [](std::span<const std::byte>, const runtime::PeerRef&) {});
    REQUIRE(ep.ok());
    double identity_before =
        c.metric("front", "tandem:fabric_auth_failures_total", "reason=\"identity\"");
    capnp::MallocMessageBuilder message;
    auto e = message.initRoot<wire::Envelope>();
    e.setProtocolVersion(1);
    messages::set_name(e.initSource(), {"decode", "node", ""});
    messages::set_name(e.initDestination(), {"front", "node", ""});
    auto hb = e.getBody().initHeartbeat();
    hb.setIncarnation(0xbadbad);
    hb.setSequence(1);
    auto words = messages::encode_frame(message);
    auto bytes = messages::frame_span(words);
    auto peer = (*ep)->peer(address_of(c, "front"));
    REQUIRE(peer.ok());
    REQUIRE((*ep)->send(*peer, std::vector<std::byte>(bytes.begin(), bytes.end())).ok());
    CHECK(eventually(5000ms, [&] {
      return c.metric("front", "tandem:fabric_auth_failures_total", "reason=\"identity\"") >
             identity_before;
    }));
    CHECK(c.node("front").log().find("peer decode is restarted") == std::string::npos);
  }
  // Admin commands work for it (it holds the cluster key) and leave an audit line.
  auto drained = (*client)->admin("decode", "drain", {}, 3000ms);
  REQUIRE(drained.ok());
  CHECK(drained->ok);
  (void)(*client)->admin("decode", "undrain", {}, 3000ms);
  CHECK(eventually(3000ms, [&] {
    std::string log = c.node("decode").log();
    return log.find("audit: " + (*client)->name() + " (client at 127.0.0.1:") != std::string::npos &&
           log.find("cluster key") != std::string::npos && log.find("ran: drain") != std::string::npos;
  }));
}

TEST_CASE("keys: another key is refused, the admin token administers, files are checked") {
  std::string dir = make_temp_dir("keys");
  write_key(dir + "/cluster.key");
  write_key(dir + "/admin.token");
  write_key(dir + "/other.key");
  ServeCluster c(Layout::one_node, 32, 0, "[admin]\ntoken_file = \"" + dir + "/admin.token\"\n",
                 "", "", false, true, "", "", "key_file = \"" + dir + "/cluster.key\"\n");
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  auto shell = [&](const std::vector<std::string>& extra, const std::string& command) {
    std::vector<std::string> argv = {tandem_bin(), "shell", "--manifest", c.manifest_path(),
                                     "--timeout-ms", "1500"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {"-c", command});
    return run(argv, 20000ms);
  };
  SUBCASE("a wrong key gets no answer at all, and the node says so once") {
    double before = c.metric("solo", "tandem:fabric_auth_failures_total", "reason=\"unknown_key\"");
    auto r = shell({"--token-file", dir + "/other.key"}, "nodes");
    CHECK(r.exit_code != 0);
    CHECK(c.metric("solo", "tandem:fabric_auth_failures_total", "reason=\"unknown_key\"") > before);
    CHECK(c.node("solo").log().find("refused a frame from client-") != std::string::npos);
  }
  SUBCASE("the admin token runs admin commands, audited under its key") {
    auto r = shell({"--token-file", dir + "/admin.token"}, "drain solo");
    CHECK_MESSAGE(r.exit_code == 0, r.output);
    CHECK(r.output.find("drained every prefill and decode instance on node solo") != std::string::npos);
    CHECK(shell({"--token-file", dir + "/admin.token"}, "undrain solo").exit_code == 0);
    CHECK(eventually(3000ms, [&] {
      std::string log = c.node("solo").log();
      return log.find("admin key") != std::string::npos && log.find("ran: drain") != std::string::npos;
    }));
  }
  SUBCASE("a key file others can read, or too short, stops the node at start with why") {
    std::string loose = dir + "/loose.key";
    write_key(loose);
    ::chmod(loose.c_str(), 0644);
    std::string text = read_file(c.manifest_path());
    auto at = text.find(dir + "/cluster.key");
    REQUIRE(at != std::string::npos);
    std::string m1 = dir + "/loose.toml";
    write_file(m1, text.substr(0, at) + loose + text.substr(at + (dir + "/cluster.key").size()));
    auto r = run({tandem_bin(), "node", "--manifest", m1, "--node", "solo"}, 20000ms);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(loose + ": mode 0644 lets group or others read it") != std::string::npos);
    std::string short_key = dir + "/short.key";
    write_file(short_key, "0123456789\n");
    ::chmod(short_key.c_str(), 0600);
    std::string m2 = dir + "/short.toml";
    write_file(m2, text.substr(0, at) + short_key + text.substr(at + (dir + "/cluster.key").size()));
    auto s = run({tandem_bin(), "check", m2}, 20000ms);
    CHECK(s.exit_code == 1);
    CHECK(s.output.find("10 bytes; a key has at least 32") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("rotation: nodes on the old and the new key meet while both are accepted") {
  std::string dir = make_temp_dir("rotate");
  write_key(dir + "/old.key");
  write_key(dir + "/new.key");
  // Every node accepts both; the manifest connects with the old one.
  ServeCluster c(Layout::loopback3, 1, 0, "", "", "", false, true, "", "",
                 "key_file = \"" + dir + "/old.key\"\naccept_key_files = [\"" + dir +
                     "/new.key\"]\n");
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  // The decode node restarts on the new key (accepting the old): it rejoins and serves.
  std::string text = read_file(c.manifest_path());
  std::string swapped = text;
  auto a = swapped.find(dir + "/old.key");
  auto b = swapped.find(dir + "/new.key");
  REQUIRE((a != std::string::npos && b != std::string::npos));
  swapped.replace(b, (dir + "/new.key").size(), dir + "/old.key");
  swapped.replace(a, (dir + "/old.key").size(), dir + "/new.key");
  c.node("decode").signal(SIGKILL);
  c.node("decode").wait(5000ms);
  write_file(dir + "/rotated.toml", swapped);
  Child rotated({tandem_bin(), "node", "--manifest", dir + "/rotated.toml", "--node", "decode"},
                dir + "/decode-rotated.log");
  // It uses the cluster's original manifest path for everything else: same ports.
  CHECK_MESSAGE(eventually(20000ms, [&] {
                  auto r = complete(c.http_port(), "The bird sang a song", 8);
                  return r.error.empty();
                }),
                rotated.log());
  // A client on a third key is refused.
  write_key(dir + "/third.key");
  auto r = run({tandem_bin(), "shell", "--manifest", c.manifest_path(), "--timeout-ms", "1000",
                "--token-file", dir + "/third.key", "-c", "nodes"},
               20000ms);
  CHECK(r.exit_code != 0);
  rotated.signal(SIGTERM);
  rotated.wait(5000ms);
  std::filesystem::remove_all(dir);
}
