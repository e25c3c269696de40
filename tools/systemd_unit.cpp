#include "tools/systemd_unit.hpp"

#include "runtime/base/assert.hpp"

namespace tandem::tools {

std::string systemd_unit_name(const config::Manifest& manifest, const std::string& node) {
  return "tandem-" + manifest.cluster.name + "-" + node + ".service";
}

Result<std::string> systemd_unit(const config::Manifest& manifest, const std::string& node,
                                 const std::string& tandem_bin, const std::string& manifest_path) {
  RT_ASSERT(!tandem_bin.empty() && tandem_bin[0] == '/', tandem_bin);
  RT_ASSERT(!manifest_path.empty() && manifest_path[0] == '/', manifest_path);
  const config::Node* n = manifest.find_node(node);
  if (n == nullptr) {
    std::string names;
    for (const auto& each : manifest.nodes) names += (names.empty() ? "" : ", ") + each.name;
    return make_error(ErrorKind::not_found,
                      "the manifest has no node '" + node + "' (it has: " + names + ")");
  }
  if (manifest.cluster.key_file.empty()) {
    // The key of a keyless manifest lives in the state directory of whoever starts the node;
    // under systemd that is the unit's own, which `tandem shell` run by an operator does
    // not look in.
    return make_error(ErrorKind::invalid,
                      "a node run by systemd needs [cluster] key_file: write one with `tandem "
                      "keygen /etc/tandem/cluster.key` and name it in the manifest");
  }
  // SIGTERM starts a drain of up to drain_timeout_ms; give it that plus time to close.
  uint64_t stop_s = (uint64_t{manifest.supervisor.drain_timeout_ms} + 999) / 1000 + 15;
  std::string roles;
  for (const auto& inst : n->instances) {
    roles +=
        (roles.empty() ? "" : ", ") + std::string(config::to_string(inst.role)) + " " + inst.name;
  }
  std::string unit;
  unit += "# Written by `tandem systemd` for node '" + node + "' of cluster '" +
          manifest.cluster.name + "' (" + roles + ").\n";
  unit += "[Unit]\n";
  unit += "Description=Tandem node " + node + " (cluster " + manifest.cluster.name + ")\n";
  unit += "Documentation=file://" + manifest_path + "\n";
  unit += "After=network-online.target\nWants=network-online.target\n";
  // Give up restarting after 5 failures in 2 minutes (systemd then reports the unit failed).
  unit += "StartLimitIntervalSec=120\nStartLimitBurst=5\n\n";
  unit += "[Service]\nType=simple\n";
  unit +=
      "ExecStart=" + tandem_bin + " node --manifest " + manifest_path + " --node " + node + "\n";
  unit += "Restart=on-failure\nRestartSec=2\n";
  // $STATE_DIRECTORY: where the node keeps its device-lost restarts across processes
  // (runtime/node/device_lost_record.hpp), so a device broken for good stops restarting it.
  unit += "StateDirectory=tandem\n";
  unit += "KillSignal=SIGTERM\nKillMode=mixed\nTimeoutStopSec=" + std::to_string(stop_s) + "\n";
  // RDMA (verbs) registers KV pools: locked memory must not be limited.
  unit += "LimitMEMLOCK=infinity\nLimitNOFILE=1048576\n";
  unit += "StandardOutput=journal\nStandardError=journal\n";
  unit += "SyslogIdentifier=tandem-" + node + "\n\n";
  unit += "[Install]\nWantedBy=multi-user.target\n";
  return unit;
}

}  // namespace tandem::tools
