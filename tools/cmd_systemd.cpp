// `tandem systemd MANIFEST --node N [--install]`: prints (or installs) the node's systemd unit.
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "tools/commands.hpp"
#include "tools/systemd_unit.hpp"

namespace tandem::tools {
namespace {

std::string absolute(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
}

}  // namespace

int cmd_systemd(cli::Args args) {
  cli::Flags flags("tandem systemd MANIFEST --node NODE [--install] [--dir DIR]",
                   "Writes the systemd unit that runs NODE of MANIFEST on this host: restart on\n"
                   "failure (5 per 2 minutes, then failed), SIGTERM to stop after a drain,\n"
                   "LimitMEMLOCK=infinity for RDMA, logs in the journal. Without --install it\n"
                   "prints the unit; with --install it writes DIR/tandem-CLUSTER-NODE.service\n"
                   "and prints the systemctl commands that enable and start it.");
  flags.positional("MANIFEST", "the cluster manifest (TOML)")
      .flag("node", "NODE", "the node this host runs")
      .flag("install", "", "write the unit file instead of printing it")
      .flag("dir", "DIR", "where --install writes", "/etc/systemd/system")
      .flag("bin", "PATH", "the tandem binary the unit runs (default: this one)");
  int code = 0;
  if (!flags.parse(args, &code)) return code;
  if (!flags.has("node")) {
    std::fprintf(stderr, "tandem systemd: --node NODE is required\n");
    return 2;
  }
  std::string manifest_path = absolute(flags.get("MANIFEST"));
  auto loaded = config::load_manifest(manifest_path);
  if (auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    std::fprintf(stderr, "%s", errors->describe().c_str());
    return 1;
  }
  const auto& manifest = std::get<config::Manifest>(loaded);
  std::string bin = flags.has("bin") ? absolute(flags.get("bin")) : cli::self_exe_path();
  if (bin.empty()) bin = "/usr/local/bin/tandem";
  auto unit = systemd_unit(manifest, flags.get("node"), bin, manifest_path);
  if (!unit.ok()) {
    std::fprintf(stderr, "tandem systemd: %s\n", unit.error().message.c_str());
    return 1;
  }
  if (!flags.has("install")) {
    std::fputs(unit->c_str(), stdout);
    return 0;
  }
  std::string name = systemd_unit_name(manifest, flags.get("node"));
  std::string path = flags.get("dir") + "/" + name;
  std::ofstream out(path, std::ios::trunc);
  out << *unit;
  out.close();
  if (!out) {
    std::fprintf(stderr, "tandem systemd: cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("wrote %s\nnext: systemctl daemon-reload && systemctl enable --now %s\n",
              path.c_str(), name.c_str());
  return 0;
}

}  // namespace tandem::tools
