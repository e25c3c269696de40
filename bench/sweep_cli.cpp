#include "bench/sweep_cli.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <variant>

#include "bench/plot_files.hpp"
#include "bench/serve_bench.hpp"
#include "bench/sweep.hpp"
#include "config/manifest.hpp"
#include "runtime/base/assert.hpp"
#include "tools/sim_setup.hpp"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Values of a repeatable flag (Flags::parse keeps only the last one).
std::vector<std::string> flag_values(cli::Args args, const std::string& name) {
  std::vector<std::string> values;
  const std::string flag = "--" + name, prefix = flag + "=";
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--") break;
    if (arg == flag && i + 1 < args.size()) values.emplace_back(args[++i]);
    if (arg.rfind(prefix, 0) == 0) values.push_back(arg.substr(prefix.size()));
  }
  return values;
}

bool given(cli::Args args, const std::string& name) {
  return !flag_values(args, name).empty();
}

std::string point_file(const std::string& config, uint32_t concurrency) {
  return config + "-c" + std::to_string(concurrency) + ".json";
}

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "tandem";
}

struct SweepSettings {
  std::string out_dir;
  uint64_t seed = 1;
  double duration_s = 60;
  double startup_timeout_s = 120;
};

// --sim: every point is `tandem sim` with the sweep's flags plus the configuration's spec.
class SimBackend : public SweepBackend {
 public:
  SimBackend(const cli::Flags& flags, cli::Args raw, SweepSettings settings)
      : flags_(flags), raw_(raw), settings_(std::move(settings)) {}

  Status begin_config(const SweepConfig& config) override {
    auto args = sim_args(config, 1);
    if (!args) return args.error();
    return {};
  }

  Result<SweepRow> run_point(const SweepConfig& config, uint32_t concurrency) override {
    auto args = sim_args(config, concurrency);
    if (!args) return args.error();
    std::vector<char*> argv;
    for (std::string& a : *args) argv.push_back(a.data());
    cli::Flags sim = tools::sim_flags();
    int code = 0;
    if (!sim.parse(cli::Args(argv.data(), argv.size()), &code)) {
      return make_error(ErrorKind::invalid, "bad tandem sim flags (see above)");
    }
    std::optional<tools::SimRun> run = tools::prepare_sim(sim, settings_.seed);
    if (!run) return make_error(ErrorKind::invalid, "bad tandem sim setup (see above)");
    auto result = sim::run_cluster_sim(run->config, run->requests);
    if (!result) return result.error();
    Status wrote =
        write_files(settings_.out_dir + "/points",
                    {{point_file(config.name, concurrency), sim::to_json(*result, false)}});
    if (!wrote) return wrote.error();
    return row_from_summary(config.name, concurrency, result->summary, result->hit_rate);
  }

  void end_config(const SweepConfig&) override {}

 private:
  // The tandem sim command line of one point.
  Result<std::vector<std::string>> sim_args(const SweepConfig& config, uint32_t concurrency) {
    std::vector<std::string> a = {
        "--seed",       std::to_string(settings_.seed), "--sessions", std::to_string(concurrency),
        "--duration-s", flags_.get("duration"),         "--workload", flags_.get("workload")};
    if (given(raw_, "requests")) a.insert(a.end(), {"--requests", flags_.get("requests")});
    if (given(raw_, "sessions")) a.insert(a.end(), {"--sessions-total", flags_.get("sessions")});
    if (given(raw_, "trace")) a.insert(a.end(), {"--trace", flags_.get("trace")});
    const std::string& spec = config.spec;
    // A bare path is a manifest; `manifest:FILE,policy:round-robin` combines one with flags.
    bool has_items = spec.find(':') != std::string::npos;
    if (!has_items && (spec.ends_with(".toml") || spec.find('/') != std::string::npos)) {
      a.insert(a.end(), {"--manifest", spec});
      return a;
    }
    std::stringstream items(spec);
    for (std::string item; std::getline(items, item, ',');) {
      size_t colon = item.find(':');
      std::string key = item.substr(0, colon);
      for (const char* reserved : {"seed", "sessions", "duration-s", "workload", "requests",
                                   "sessions-total", "trace", "json", "svg-dir", "timelines"}) {
        if (key == reserved) {
          return make_error(ErrorKind::invalid, "spec '" + spec + "': '" + key +
                                                    "' is set by the sweep, not per config");
        }
      }
      if (key.empty()) return make_error(ErrorKind::invalid, "spec '" + spec + "': empty item");
      a.push_back("--" + key);
      if (colon != std::string::npos) a.push_back(item.substr(colon + 1));
    }
    return a;
  }

  const cli::Flags& flags_;
  cli::Args raw_;
  SweepSettings settings_;
};

// The gateway of a manifest: the node with a gateway instance and an http_port.
Result<HttpEndpoint> gateway_of(const std::string& manifest_path) {
  auto loaded = config::load_manifest(manifest_path);
  if (const auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    return make_error(ErrorKind::invalid, manifest_path + ": " + errors->describe());
  }
  const auto& m = std::get<config::Manifest>(loaded);
  for (const auto& [node, inst] : m.instances_of(config::Role::gateway)) {
    if (!node->http_port) continue;
    return parse_endpoint(node->host + ":" + std::to_string(*node->http_port),
                          manifest_path + ": gateway node " + node->name);
  }
  return make_error(ErrorKind::invalid, manifest_path + ": no gateway node with an http_port");
}

std::string log_tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
}

// Real clusters: `tandem up MANIFEST` per configuration (or a fixed --target).
class ServeBackend : public SweepBackend {
 public:
  ServeBackend(const cli::Flags& flags, std::optional<HttpEndpoint> fixed, SweepSettings settings)
      : flags_(flags), fixed_(std::move(fixed)), settings_(std::move(settings)) {}
  ~ServeBackend() override { stop(); }
  ServeBackend(const ServeBackend&) = delete;
  ServeBackend& operator=(const ServeBackend&) = delete;

  Status begin_config(const SweepConfig& config) override {
    if (fixed_) {
      target_ = *fixed_;
      return {};
    }
    auto gateway = gateway_of(config.spec);
    if (!gateway) return gateway.error();
    target_ = *gateway;
    if (Status dir = write_files(settings_.out_dir + "/logs", {}); !dir) return dir;
    log_path_ = settings_.out_dir + "/logs/" + config.name + ".log";
    if (Status started = start(config.spec); !started) return started;
    return wait_healthy();
  }

  Result<SweepRow> run_point(const SweepConfig& config, uint32_t concurrency) override {
    auto requests = make_workload(flags_, concurrency);
    if (!requests) return requests.error();
    ServeBenchOptions o;
    o.target = target_;
    o.concurrency = concurrency;
    o.duration_s = settings_.duration_s;
    o.seed = settings_.seed;
    o.progress = false;
    o.chain_sessions = flags_.has("trace") || flags_.get("workload") == "agentic";
    auto requests_max = flags_.get_int("requests");
    if (!requests_max || *requests_max < 0) return make_error(ErrorKind::invalid, "--requests");
    o.requests_max = static_cast<uint32_t>(*requests_max);
    auto result = run_serve_bench(*requests, o);
    if (!result) return result.error();
    Status wrote = write_files(settings_.out_dir + "/points",
                               {{point_file(config.name, concurrency), to_json(*result, o)}});
    if (!wrote) return wrote.error();
    return row_from_summary(config.name, concurrency, result->summary,
                             result->request_hit_rate);
  }

  void end_config(const SweepConfig&) override { stop(); }

 private:
  Status start(const std::string& manifest) {
    std::string bin = self_exe();
    pid_ = ::fork();
    if (pid_ < 0) return make_error(ErrorKind::failed, "fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the cluster stops if the sweep is killed
      int fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execl(bin.c_str(), bin.c_str(), "up", manifest.c_str(), "--grace-ms", "3000", nullptr);
      std::_Exit(127);
    }
    return {};
  }

  Status wait_healthy() {
    auto deadline = Clock::now() + std::chrono::duration<double>(settings_.startup_timeout_s);
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return make_error(ErrorKind::failed, "the cluster exited during startup; " + log_path_ +
                                                 " ends with:\n" + log_tail(log_path_));
      }
      auto got = http_get(target_, "/health", 500);
      if (got.ok() && got->first == 200) return {};
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    stop();
    return make_error(ErrorKind::timed_out, "no healthy gateway at " + target_.host + ":" +
                                                std::to_string(target_.port) + " after " +
                                                std::to_string(settings_.startup_timeout_s) +
                                                " s; see " + log_path_);
  }

  // SIGTERM to `tandem up` (it stops its nodes), SIGKILL after 15 s.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    auto deadline = Clock::now() + std::chrono::seconds(15);
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    pid_ = -1;
  }

  const cli::Flags& flags_;
  std::optional<HttpEndpoint> fixed_;
  SweepSettings settings_;
  HttpEndpoint target_;
  std::string log_path_;
  pid_t pid_ = -1;
};

void declare_sweep_flags(cli::Flags& f) {
  f.flag("sim", "", "back-end: tandem sim in-process (configs: sim flags or manifests)")
      .flag("target", "HOST:PORT", "back-end: an already running gateway (one configuration)")
      .flag("config", "NAME=SPEC", "a configuration (repeatable): sim flags or a manifest")
      .flag("concurrency", "LIST", "comma-separated concurrencies", "8,16,32,64,128")
      .flag("duration", "S", "per point: simulated (--sim) or wall seconds of sending", "60")
      .flag("startup-timeout", "S", "real: wait this long for a cluster's /health", "120")
      .flag("out", "DIR", "where the table, plots and per-point JSON go", "sweep");
  declare_workload_flags(f, "agentic");
}

// The configurations; prints why and returns nullopt when bad.
std::optional<std::vector<SweepConfig>> read_configs(const cli::Flags& f, cli::Args args) {
  std::vector<SweepConfig> configs;
  for (const std::string& value : flag_values(args, "config")) {
    auto c = parse_config_arg(value);
    if (!c) {
      std::fprintf(stderr, "tandem bench sweep: %s\n", c.error().message.c_str());
      return std::nullopt;
    }
    for (const SweepConfig& other : configs) {
      if (other.name == c->name) {
        std::fprintf(stderr, "tandem bench sweep: --config name '%s' is repeated\n",
                     c->name.c_str());
        return std::nullopt;
      }
    }
    configs.push_back(*c);
  }
  if (f.has("target") && configs.empty()) configs.push_back({"target", "target"});
  if (configs.empty()) {
    std::fprintf(stderr, "tandem bench sweep: give at least one --config NAME=SPEC\n");
    return std::nullopt;
  }
  if (f.has("target") && configs.size() > 1) {
    std::fprintf(stderr, "tandem bench sweep: --target takes a single configuration\n");
    return std::nullopt;
  }
  return configs;
}

bool read_settings(const cli::Flags& f, SweepSettings& s) {
  auto seed = f.get_int("seed");
  auto duration = f.get_double("duration");
  auto startup = f.get_double("startup-timeout");
  if (!seed || !duration || !startup) return false;
  if (*seed < 0 || *seed > UINT32_MAX || !(*duration > 0) || !(*startup > 0)) {
    std::fprintf(stderr,
                 "tandem bench sweep: --seed in 0..2^32-1, --duration and --startup-timeout > 0\n");
    return false;
  }
  s.seed = static_cast<uint64_t>(*seed);
  s.duration_s = *duration;
  s.startup_timeout_s = *startup;
  s.out_dir = f.get("out");
  if (s.out_dir.empty()) return std::fprintf(stderr, "tandem bench sweep: --out is empty\n"), false;
  return true;
}

int report(const std::vector<SweepRow>& rows, const SweepMeta& meta, const std::string& out) {
  std::string table = sweep_table(rows);
  std::fputs(table.c_str(), stdout);
  auto files = sweep_plots(rows, meta.backend + ", " + meta.workload);
  files.emplace_back("sweep.txt", table);
  files.emplace_back("sweep.json", sweep_json(rows, meta));
  files.emplace_back("sweep.csv", sweep_csv(rows));
  if (Status wrote = write_files(out, files); !wrote) {
    std::fprintf(stderr, "tandem bench sweep: %s\n", wrote.error().message.c_str());
    return 1;
  }
  std::printf("wrote %s/sweep.{txt,json,csv}, 4 plots and points/\n", out.c_str());
  for (const SweepRow& r : rows) {
    if (r.failed_count > 0) return 3;
  }
  return 0;
}

}  // namespace

int run_sweep_cli(cli::Args args) {
  cli::Flags f("tandem bench sweep (--sim | --target HOST:PORT) --config NAME=SPEC... [flags]",
               "Runs the same seeded workload at several concurrencies on several\n"
               "configurations (tandem sim in-process with --sim; else real clusters started\n"
               "from manifests with `tandem up`, or --target) and writes one table (text,\n"
               "JSON, CSV) and one SVG per metric. See docs/benchmarks.md.");
  declare_sweep_flags(f);
  int code = 0;
  if (!f.parse(args, &code)) return code;
  SweepSettings settings;
  if (!read_settings(f, settings)) return 2;
  auto concurrencies = parse_concurrency_list(f.get("concurrency"));
  if (!concurrencies) {
    std::fprintf(stderr, "tandem bench sweep: %s\n", concurrencies.error().message.c_str());
    return 2;
  }
  auto configs = read_configs(f, args);
  if (!configs) return 2;
  if (f.has("sim") && f.has("target")) {
    std::fprintf(stderr, "tandem bench sweep: --sim and --target exclude each other\n");
    return 2;
  }
  std::unique_ptr<SweepBackend> backend;
  if (f.has("sim")) {
    backend = std::make_unique<SimBackend>(f, args, settings);
  } else {
    std::optional<HttpEndpoint> fixed;
    if (f.has("target")) {
      auto t = parse_endpoint(f.get("target"), "--target");
      if (!t) return std::fprintf(stderr, "tandem bench sweep: %s\n", t.error().message.c_str()), 2;
      fixed = *t;
    }
    backend = std::make_unique<ServeBackend>(f, fixed, settings);
  }
  auto rows = run_sweep(*backend, *configs, *concurrencies);
  if (!rows) {
    std::fprintf(stderr, "tandem bench sweep: %s\n", rows.error().describe().c_str());
    return 1;
  }
  SweepMeta meta{f.has("sim") ? "sim" : "serve", f.has("trace") ? "trace" : f.get("workload"),
                 settings.seed, settings.duration_s};
  return report(*rows, meta, settings.out_dir);
}

}  // namespace tandem::bench
