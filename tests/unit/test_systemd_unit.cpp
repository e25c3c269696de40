// `tandem systemd`: the unit text for a node of a manifest.
#include <doctest.h>

#include <variant>

#include "tools/systemd_unit.hpp"

using namespace tandem;

namespace {
const char* manifest_text = R"([cluster]
name = "c4"
key_file = "/etc/tandem/cluster.key"
[model]
name = "m"
path = "models/m"
[supervisor]
drain_timeout_ms = 45000
[[node]]
name = "host-a"
host = "127.0.0.1"
fabric_port = 17100
admin_port = 17200
http_port = 8000
  [[node.instance]]
  role = "gateway"
  name = "gw"
  [[node.instance]]
  role = "router"
  name = "rt"
  [[node.instance]]
  role = "decode"
  name = "dec"
  executor = "ex"
  [[node.instance]]
  role = "executor"
  name = "ex"
  device = "cpu"
  devices = [0]
)";
}  // namespace

TEST_CASE("systemd unit: restart on failure, drain-sized stop timeout, memlock, journal") {
  auto loaded = config::parse_manifest(manifest_text, "/etc/tandem/c4.toml");
  REQUIRE(std::holds_alternative<config::Manifest>(loaded));
  const auto& m = std::get<config::Manifest>(loaded);
  CHECK(tools::systemd_unit_name(m, "host-a") == "tandem-c4-host-a.service");
  auto unit = tools::systemd_unit(m, "host-a", "/usr/local/bin/tandem", "/etc/tandem/c4.toml");
  REQUIRE(unit.ok());
  const std::string& u = *unit;
  CHECK(u.find("ExecStart=/usr/local/bin/tandem node --manifest /etc/tandem/c4.toml --node "
               "host-a\n") != std::string::npos);
  CHECK(u.find("Restart=on-failure\n") != std::string::npos);
  CHECK(u.find("StartLimitBurst=5\n") != std::string::npos);
  CHECK(u.find("StateDirectory=tandem\n") != std::string::npos);  // the device-lost record
  CHECK(u.find("KillSignal=SIGTERM\n") != std::string::npos);
  CHECK(u.find("TimeoutStopSec=60\n") != std::string::npos);  // 45 s drain + 15
  CHECK(u.find("LimitMEMLOCK=infinity\n") != std::string::npos);
  CHECK(u.find("StandardOutput=journal\n") != std::string::npos);
  CHECK(u.find("WantedBy=multi-user.target\n") != std::string::npos);
  CHECK(u.find("(gateway gw, router rt, decode dec, executor ex)") != std::string::npos);
  auto missing = tools::systemd_unit(m, "host-z", "/usr/bin/tandem", "/etc/tandem/c4.toml");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message == "the manifest has no node 'host-z' (it has: host-a)");
}

TEST_CASE("a keyless manifest gets no unit: its key would live where the shell never looks") {
  std::string text = manifest_text;
  auto at = text.find("key_file = \"/etc/tandem/cluster.key\"\n");
  REQUIRE(at != std::string::npos);
  text.erase(at, std::string("key_file = \"/etc/tandem/cluster.key\"\n").size());
  auto loaded = tandem::config::parse_manifest(text, "m.toml");
  REQUIRE(std::holds_alternative<tandem::config::Manifest>(loaded));  // one host: loads
  auto unit = tandem::tools::systemd_unit(std::get<tandem::config::Manifest>(loaded),
                                          std::get<tandem::config::Manifest>(loaded).nodes[0].name,
                                          "/usr/local/bin/tandem", "/etc/tandem/m.toml");
  REQUIRE_FALSE(unit.ok());
  CHECK(unit.error().message.find("key_file") != std::string::npos);
}
