// Three real `tandem node` processes on loopback, talking over the libfabric tcp provider.
#include <doctest.h>

#include <arpa/inet.h>

#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include "runtime/client/client.hpp"
#include "tests/support/process.hpp"

using namespace tandem;
using namespace tandem::testing;
using namespace std::chrono_literals;

namespace {

struct Ports {
  uint16_t fabric, admin;
};

class Cluster {
 public:
  Cluster() : dir_(make_temp_dir("cluster")) {
    for (const char* name : {"alpha", "beta", "gamma"}) ports_[name] = {free_port(), free_port()};
    manifest_path_ = dir_ + "/cluster.toml";
    write_file(manifest_path_, manifest_text());
    auto loaded = config::load_manifest(manifest_path_);
    REQUIRE(std::holds_alternative<config::Manifest>(loaded));
    manifest_ = std::get<config::Manifest>(std::move(loaded));
    for (const auto& [name, ports] : ports_) start(name);
    auto client = runtime::ClusterClient::connect(manifest_, "127.0.0.1");
    REQUIRE(client.ok());
    client_ = std::move(client).value();
  }
  ~Cluster() {
    for (auto& [name, child] : nodes_) child->signal(SIGTERM);
    for (auto& [name, child] : nodes_) child->wait(5000ms);
  }

  void start(const std::string& name) {
    nodes_[name] = std::make_unique<Child>(
        std::vector<std::string>{tandem_bin(), "node", "--manifest", manifest_path_, "--node", name},
        dir_ + "/" + name + ".log");
  }
  Child& node(const std::string& name) { return *nodes_.at(name); }
  runtime::ClusterClient& client() { return *client_; }
  const std::string& manifest_path() const { return manifest_path_; }
  const config::Manifest& manifest() const { return manifest_; }
  Ports ports(const std::string& name) { return ports_.at(name); }

  // The state column of `nodes` as seen by `observer`, per node name.
  std::map<std::string, std::string> states(const std::string& observer) {
    std::map<std::string, std::string> out;
    auto answer = client_->admin(observer, "nodes", {}, 1000ms);
    if (!answer.ok()) return out;
    for (size_t r = 1; r < answer->rows.size(); ++r) out[answer->rows[r][0]] = answer->rows[r][2];
    return out;
  }
  bool all_up(const std::string& observer) {
    auto s = states(observer);
    if (s.size() != 3) return false;
    for (const auto& [name, state] : s) {
      if (state.rfind("up", 0) != 0) return false;
    }
    return true;
  }

 private:
  std::string manifest_text() {
    std::string text = R"(
[cluster]
name = "it-cluster"
[membership]
heartbeat_interval_ms = 100
heartbeat_miss_max = 5
[model]
name = "stories15M"
block_tokens = 16
max_model_tokens = 256
path = ")" + source_root() + R"(/models/stories15M"
)";
    auto node = [&](const std::string& name, const std::string& instances) {
      Ports p = ports_[name];
      return "\n[[node]]\nname = \"" + name + "\"\nhost = \"127.0.0.1\"\nfabric_port = " +
             std::to_string(p.fabric) + "\nadmin_port = " + std::to_string(p.admin) + "\n" +
             instances;
    };
    text += node("alpha",
                 "http_port = " + std::to_string(free_port()) +
                     "\n[[node.instance]]\nrole = \"gateway\"\nname = \"gateway\"\n"
                     "[[node.instance]]\nrole = \"router\"\nname = \"router\"\n");
    text += node("beta",
                 "workers = 3\n"
                 "[[node.instance]]\nrole = \"prefill\"\nname = \"prefill\"\nexecutor = \"ep\"\n"
                 "[[node.instance]]\nrole = \"executor\"\nname = \"ep\"\ndevice = \"sim\"\n");
    text += node("gamma",
                 "[[node.instance]]\nrole = \"decode\"\nname = \"decode\"\nexecutor = \"ed\"\n"
                 "[[node.instance]]\nrole = \"executor\"\nname = \"ed\"\ndevice = \"sim\"\n");
    return text;
  }

  std::string dir_, manifest_path_;
  std::map<std::string, Ports> ports_;
  std::map<std::string, std::unique_ptr<Child>> nodes_;
  config::Manifest manifest_;
  std::unique_ptr<runtime::ClusterClient> client_;
};

std::vector<std::byte> ping_frame(const std::string& node, uint32_t version, bool truncate) {
  capnp::MallocMessageBuilder message;
  auto envelope = message.initRoot<wire::Envelope>();
  envelope.setProtocolVersion(version);
  messages::set_name(envelope.initSource(), {"raw-client", "client", ""});
  messages::set_name(envelope.initDestination(), {node, "node", ""});
  envelope.setSourceAddress("127.0.0.1:9");
  envelope.getBody().initPing().setNonce(7);
  auto words = messages::encode_frame(message);
  auto bytes = messages::frame_span(words);
  std::vector<std::byte> out(bytes.begin(), bytes.end());
  if (truncate) out.resize(out.size() / 2 / 8 * 8);
  return out;
}

uint64_t metric_value(const std::string& text, const std::string& series) {
  auto at = text.find(series + " ");
  if (at == std::string::npos) return 0;
  return std::stoull(text.substr(at + series.size() + 1));
}

void send_garbage_tcp(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  std::mt19937 rng(1234);
  std::vector<uint8_t> junk(65536);
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  (void)!write(fd, junk.data(), junk.size());
  std::this_thread::sleep_for(100ms);
  close(fd);
}

}  // namespace

TEST_CASE("three nodes on loopback: membership, pings, RMA, bad input, kill and restart") {
  Cluster cluster;
  REQUIRE_MESSAGE(eventually(8000ms, [&] { return cluster.all_up("alpha"); }),
                  cluster.node("alpha").log());
  REQUIRE(eventually(3000ms, [&] { return cluster.all_up("gamma"); }));

  SUBCASE("every node pings every other, and the client reaches every actor") {
    for (const char* from : {"alpha", "beta", "gamma"}) {
      for (const char* to : {"alpha", "beta", "gamma"}) {
        if (std::string(from) == to) continue;
        auto answer = cluster.client().admin(from, "ping", {to}, 3000ms);
        REQUIRE_MESSAGE(answer.ok(), from, " -> ", to);
        CHECK(answer->ok);
        REQUIRE(answer->rows.size() == 2);
        CHECK(std::stod(answer->rows[1][2]) > 0.0);
      }
    }
    for (const char* actor : {"alpha/gateway/gateway", "alpha/router/router",
                              "beta/prefill/prefill", "beta/executor/ep", "gamma/decode/decode"}) {
      auto parsed = messages::ActorName::parse(actor);
      REQUIRE(parsed.ok());
      CHECK_MESSAGE(cluster.client().ping(*parsed, 2000ms).ok(), actor);
    }
    auto missing = cluster.client().admin("alpha", "ping", {"alpha/decode/nobody"}, 4000ms);
    REQUIRE(missing.ok());
    CHECK_FALSE(missing->ok);
  }

  SUBCASE("a node runs the actor worker threads its manifest asks for (else the default)") {
    auto workers_of = [&](const char* node) {
      auto stats = cluster.client().admin(node, "stats", {}, 2000ms);
      REQUIRE(stats.ok());
      return metric_value(stats->text, "tandem_node_workers{node=\"" + std::string(node) + "\"}");
    };
    CHECK(workers_of("beta") == 3);
    CHECK(workers_of("alpha") == config::default_workers());
    // CAF 0.17 names its worker threads "caf.multiplexer".
    auto threads_named = [](pid_t pid, const std::string& name) {
      int count = 0;
      for (const auto& task : std::filesystem::directory_iterator(
               "/proc/" + std::to_string(pid) + "/task")) {
        count += read_file(task.path().string() + "/comm") == name + "\n" ? 1 : 0;
      }
      return count;
    };
    CHECK(threads_named(cluster.node("beta").pid(), "caf.multiplexer") == 3);
    CHECK(threads_named(cluster.node("alpha").pid(), "caf.multiplexer") ==
          static_cast<int>(config::default_workers()));
  }

  SUBCASE("a 64 MiB region on one node is read by another via RMA and checksums agree") {
    auto exposed = cluster.client().admin("beta", "rma-expose", {std::to_string(64 << 20)}, 5000ms);
    REQUIRE(exposed.ok());
    REQUIRE(exposed->ok);
    const auto& e = exposed->rows.at(1);  // node, base, bytes, key, checksum
    auto read = cluster.client().admin("gamma", "rma-read", {e[0], e[1], e[2], e[3]}, 60000ms);
    REQUIRE(read.ok());
    REQUIRE_MESSAGE(read->ok, read->text);
    CHECK(read->rows.at(1).at(0) == std::to_string(64 << 20));
    CHECK(read->rows.at(1).at(1) == e[4]);  // checksum read == checksum exposed
    auto stats = cluster.client().admin("gamma", "stats", {}, 2000ms);
    REQUIRE(stats.ok());
    CHECK(metric_value(stats->text, "tandem_rma_bytes_total{node=\"gamma\"}") >= (64u << 20));
    // The shell does the same end to end.
    auto shell = run({tandem_bin(), "shell", "--manifest", cluster.manifest_path(), "-c",
                      "rma-test beta alpha 16"}, 60000ms);
    CHECK_MESSAGE(shell.exit_code == 0, shell.output);
    CHECK(shell.output.find("OK") != std::string::npos);
  }

  SUBCASE("garbage bytes and truncated frames leave the node serving; they are counted") {
    send_garbage_tcp(cluster.ports("beta").fabric);
    std::string beta_address = "127.0.0.1:" + std::to_string(cluster.ports("beta").fabric);
    REQUIRE(cluster.client().send_raw(beta_address, ping_frame("beta", 1, true)).ok());
    std::vector<std::byte> odd(13, std::byte{0x41});
    REQUIRE(cluster.client().send_raw(beta_address, odd).ok());
    CHECK(eventually(3000ms, [&] {
      auto stats = cluster.client().admin("beta", "stats", {}, 1000ms);
      return stats.ok() &&
             metric_value(stats->text,
                          "tandem_fabric_frames_dropped_total{node=\"beta\",reason=\"malformed\"}") >= 2;
    }));
    CHECK(cluster.node("beta").running());
    CHECK(cluster.client().ping({"beta", "node", ""}, 2000ms).ok());
    CHECK(cluster.all_up("beta"));
  }

  SUBCASE("a peer speaking another protocol version is refused, naming both versions") {
    auto reply = cluster.client().call({"alpha", "node", ""}, [](wire::Envelope::Builder b) {
      b.setProtocolVersion(2);
      auto hello = b.getBody().initHello();
      hello.setProtocolVersion(2);
      hello.setNodeName("intruder");
      hello.setIsClient(true);
    }, 2000ms);
    REQUIRE(reply.ok());
    auto body = (*reply)->envelope().getBody();
    REQUIRE(body.which() == wire::Envelope::Body::HELLO_ACK);
    CHECK_FALSE(body.getHelloAck().getAccepted());
    CHECK(body.getHelloAck().getProtocolVersion() == 1);
    CHECK(eventually(2000ms, [&] {
      std::string log = cluster.node("alpha").log();
      return log.find("protocol version 2") != std::string::npos &&
             log.find("this node speaks 1") != std::string::npos;
    }));
  }

  SUBCASE("SIGKILL: the node shows down within 2 s in `tandem shell -c nodes`, up after restart") {
    auto shell_nodes = [&] {
      return run({tandem_bin(), "shell", "--manifest", cluster.manifest_path(), "-c", "nodes"},
                 5000ms);
    };
    auto gamma_state = [](const std::string& output) {
      auto at = output.find("\ngamma ");
      if (at == std::string::npos) return std::string();
      std::istringstream line(output.substr(at + 1, output.find('\n', at + 1) - at - 1));
      std::string name, address, state;
      line >> name >> address >> state;
      return state;
    };
    CHECK(gamma_state(shell_nodes().output) == "up");
    cluster.node("gamma").signal(SIGKILL);
    auto killed = std::chrono::steady_clock::now();
    bool down = eventually(2000ms, [&] { return gamma_state(shell_nodes().output) == "down"; });
    auto took = std::chrono::steady_clock::now() - killed;
    CHECK_MESSAGE(down, "gamma was not shown down within 2 s");
    MESSAGE("down shown after ", std::chrono::duration_cast<std::chrono::milliseconds>(took).count(),
            " ms");
    cluster.node("gamma").wait(2000ms);
    cluster.start("gamma");
    CHECK(eventually(5000ms, [&] { return gamma_state(shell_nodes().output) == "up"; }));
    CHECK_MESSAGE(
        eventually(5000ms, [&] { return cluster.all_up("beta") && cluster.all_up("gamma"); }),
        "beta's log:\n", cluster.node("beta").log(), "\ngamma's log:\n", cluster.node("gamma").log());
    auto ping = cluster.client().admin("beta", "ping", {"gamma/decode/decode"}, 3000ms);
    REQUIRE(ping.ok());
    CHECK(ping->ok);
  }
}
