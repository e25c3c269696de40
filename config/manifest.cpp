// Parses and validates the cluster manifest (TOML via toml++). Contract: manifest.hpp;
// every key: docs/manifest.md. The loader reads every section, collecting issues instead of
// stopping at the first, then runs the cross-checks (names, ports, executors, roles).
#include "config/manifest.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <tuple>
#include <type_traits>

namespace tandem::config {
namespace {

namespace fs = std::filesystem;

constexpr size_t no_index = std::numeric_limits<size_t>::max();
constexpr uint32_t instance_count_max = 1024;

struct Pos {
  uint32_t line = 0;
  uint32_t column = 0;
};

Pos pos_of(const toml::source_region& region) {
  return {static_cast<uint32_t>(region.begin.line), static_cast<uint32_t>(region.begin.column)};
}

std::string type_name(toml::node_type type) {
  switch (type) {
    case toml::node_type::none: return "nothing";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
  }
  return "an unknown type";
}

// The empty key (`"" = 1`, valid TOML) is named as TOML spells it, so every issue has a key.
std::string join_key(const std::string& path, std::string_view key) {
  std::string name = key.empty() ? std::string("\"\"") : std::string(key);
  return path.empty() ? name : path + "." + name;
}

std::string join_words(std::span<const std::string_view> words) {
  std::string out;
  for (auto word : words) out += (out.empty() ? "" : ", ") + std::string(word);
  return out;
}

// Names of clusters, nodes and instances end up in logs, metrics and file names.
// "." and ".." are not names: a node's name becomes a directory (tier 2, state files).
bool valid_name(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  });
}

// Collects the issues of one file.
class Sink {
 public:
  explicit Sink(std::string file) : file_(std::move(file)) {}
  void add(Pos pos, std::string key, std::string message) {
    RT_ASSERT(!key.empty(), "issue without a key:", message);
    issues_.push_back({file_, pos.line, pos.column, std::move(key), std::move(message)});
  }
  bool empty() const { return issues_.empty(); }
  ManifestErrors take() {
    RT_ASSERT(!issues_.empty(), "no issues to report");
    // In file order; issues without a place (line 0) last.
    std::stable_sort(issues_.begin(), issues_.end(), [](const auto& a, const auto& b) {
      auto rank = [](const ManifestIssue& i) {
        return std::tuple(i.line == 0, i.line, i.column);
      };
      return rank(a) < rank(b);
    });
    return ManifestErrors{std::move(issues_)};
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::vector<ManifestIssue> issues_;
};

// Reads one TOML table. Unknown keys are reported on construction. Each read_* returns true
// when `out` holds a usable value: read from the table, or (optional key absent) left at
// its default. Type and range problems are reported and return false.
class TableReader {
 public:
  TableReader(Sink& sink, const toml::table& table, std::string path,
              std::initializer_list<std::string_view> known)
      : TableReader(sink, table, std::move(path),
                    std::span<const std::string_view>(known.begin(), known.size())) {}
  TableReader(Sink& sink, const toml::table& table, std::string path,
              std::span<const std::string_view> names)
      : sink_(sink), table_(table), path_(std::move(path)) {
    for (auto&& [key, value] : table_) {
      if (std::find(names.begin(), names.end(), key.str()) != names.end()) continue;
      std::string where = path_.empty() ? "at the top level" : "in " + path_;
      sink_.add(pos_of(key.source()), join_key(path_, key.str()),
                "unknown key " + where + "; accepted: " + join_words(names));
    }
  }

  const std::string& path() const { return path_; }
  std::string key(std::string_view name) const { return join_key(path_, name); }
  const toml::node* find(std::string_view name) const { return table_.get(name); }
  Pos pos() const { return pos_of(table_.source()); }
  // The value's position, or the table's when the key is absent.
  Pos pos(std::string_view name) const {
    const toml::node* node = find(name);
    return node ? pos_of(node->source()) : pos();
  }
  void issue(std::string_view name, std::string message) {
    sink_.add(pos(name), key(name), std::move(message));
  }

  template <class T>
  bool read_int(std::string_view name, int64_t min, int64_t max, T& out, bool required = false) {
    static_assert(std::is_unsigned_v<T>);
    RT_ASSERT(min >= 0 && min <= max, "bad range for", name);
    RT_ASSERT(static_cast<uint64_t>(max) <= std::numeric_limits<T>::max(), "range too wide");
    const toml::node* node = typed(name, toml::node_type::integer, required);
    if (!node) return !required && !find(name);
    int64_t value = node->as_integer()->get();
    if (value < min || value > max) {
      issue(name, "value " + std::to_string(value) + " is out of range " + std::to_string(min) +
                      ".." + std::to_string(max));
      return false;
    }
    out = static_cast<T>(value);
    return true;
  }

  bool read_double(std::string_view name, double min, double max, double& out) {
    RT_ASSERT(min <= max, "bad range for", name);
    const toml::node* node = typed(name, toml::node_type::floating_point, false);
    if (!node) return !find(name);
    double value = node->value<double>().value_or(0.0);
    if (!(value >= min && value <= max)) {
      std::ostringstream text;
      text << "value " << value << " is out of range " << min << ".." << max;
      issue(name, text.str());
      return false;
    }
    out = value;
    return true;
  }

  bool read_bool(std::string_view name, bool& out) {
    const toml::node* node = typed(name, toml::node_type::boolean, false);
    if (!node) return !find(name);
    out = node->as_boolean()->get();
    return true;
  }

  // An array of non-empty strings; each bad element is reported with its index. Sets `out`
  // only when every element is good.
  bool read_string_list(std::string_view name, std::vector<std::string>& out) {
    const toml::node* node = find(name);
    if (!node) return true;
    const toml::array* array = node->as_array();
    if (!array) {
      issue(name, "expected an array of strings, got " + type_name(node->type()));
      return false;
    }
    std::vector<std::string> values;
    for (size_t i = 0; i < array->size(); ++i) {
      const toml::node& element = *array->get(i);
      std::string element_key = key(name) + "[" + std::to_string(i) + "]";
      if (!element.is_string()) {
        sink_.add(pos_of(element.source()), element_key,
                  "expected a string, got " + type_name(element.type()));
      } else if (element.as_string()->get().empty()) {
        sink_.add(pos_of(element.source()), element_key, "must not be empty");
      } else {
        values.push_back(element.as_string()->get());
      }
    }
    if (values.size() != array->size()) return false;
    out = std::move(values);
    return true;
  }

  // Required strings must also be non-empty.
  bool read_string(std::string_view name, std::string& out, bool required = false) {
    const toml::node* node = typed(name, toml::node_type::string, required);
    if (!node) return !required && !find(name);
    std::string value = node->as_string()->get();
    if (required && value.empty()) {
      issue(name, "must not be empty");
      return false;
    }
    out = std::move(value);
    return true;
  }

  // A required name of a cluster, node or instance.
  bool read_name(std::string_view name, std::string& out) {
    std::string value;
    if (!read_string(name, value, true)) return false;
    if (!valid_name(value)) {
      issue(name, "'" + value + "' may use only letters, digits, '.', '_' and '-' (and is not "
                  "'.' or '..')");
      return false;
    }
    out = std::move(value);
    return true;
  }

  // One of `options`; sets `index` into it.
  bool read_one_of(std::string_view name, std::span<const std::string_view> options,
                   size_t& index, bool required = false) {
    RT_ASSERT(!options.empty(), "no options for", name);
    std::string value;
    if (!read_string(name, value, required)) return false;
    if (!find(name)) return true;
    for (size_t i = 0; i < options.size(); ++i) {
      if (options[i] == value) {
        index = i;
        return true;
      }
    }
    issue(name, "unknown value '" + value + "'; accepted: " + join_words(options));
    return false;
  }

  // An enum spelled by to_string(E); `all` lists every value.
  template <class E, size_t N>
  bool read_enum(std::string_view name, const E (&all)[N], E& out, bool required = false) {
    std::array<std::string_view, N> options;
    for (size_t i = 0; i < N; ++i) options[i] = to_string(all[i]);
    size_t index = no_index;
    if (!read_one_of(name, options, index, required)) return false;
    if (index != no_index) out = all[index];
    return true;
  }

 private:
  // The node if present with the right type; reports missing (when required) and wrong type.
  const toml::node* typed(std::string_view name, toml::node_type type, bool required) {
    const toml::node* node = find(name);
    if (!node) {
      if (required) issue(name, "required key is missing");
      return nullptr;
    }
    bool number_ok = type == toml::node_type::floating_point && node->is_integer();
    if (node->type() != type && !number_ok) {
      issue(name, "expected " + type_name(type) + ", got " + type_name(node->type()));
      return nullptr;
    }
    return node;
  }

  Sink& sink_;
  const toml::table& table_;
  std::string path_;
};

// Where a node was declared (parallel to Manifest::nodes).
struct NodeDecl {
  std::string path;  // "node[1]"
  Pos pos, name_pos;
  std::array<Pos, 3> port_pos;  // fabric, admin, http
};

// An instance table as written, before count expansion.
struct InstanceDecl {
  std::string path;  // "node[1].instance[0]" or "instance[2]"
  Pos pos, name_pos, executor_pos, devices_pos;
  size_t node_index = no_index;
  bool usable = false;     // role, name and node are known: it can be expanded
  Instance proto;          // role, name, device and executor as written
  uint32_t count = 1;
};

// Where one expanded instance came from.
struct Origin {
  size_t decl_index = no_index;
  uint32_t copy_index = 0;
};

constexpr std::array<std::string_view, 3> port_keys = {"fabric_port", "admin_port", "http_port"};
constexpr std::array<std::string_view, 3> providers = {"tcp;ofi_rxm", "shm", "verbs;ofi_rxm"};
constexpr std::array<std::string_view, 5> log_levels = {"trace", "debug", "info", "warn",
                                                        "error"};
constexpr ChatFormat chat_formats_all[] = {ChatFormat::auto_detect, ChatFormat::plain,
                                           ChatFormat::chatml, ChatFormat::minimax_m2};
constexpr KvIndexMode kv_index_modes_all[] = {KvIndexMode::approximate, KvIndexMode::precise};
constexpr RouterPolicy router_policies_all[] = {RouterPolicy::prefix_aware,
                                                RouterPolicy::round_robin, RouterPolicy::random};
constexpr SpeculativeMethod speculative_methods_all[] = {
    SpeculativeMethod::none, SpeculativeMethod::ngram, SpeculativeMethod::suffix,
    SpeculativeMethod::eagle3};
constexpr DeviceKind device_kinds_all[] = {DeviceKind::cpu, DeviceKind::sim, DeviceKind::rbln};
constexpr DeviceLostAction device_lost_actions_all[] = {DeviceLostAction::restart_node,
                                                        DeviceLostAction::stay};

class Loader {
 public:
  Loader(std::string file, std::string dir) : sink_(std::move(file)) {
    manifest_.file = sink_.file();
    manifest_.dir = std::move(dir);
  }
  std::variant<Manifest, ManifestErrors> run(std::string_view text);
  // `text` is the body of a [router] table alone: read by the manifest's own rules.
  std::variant<RouterSection, ManifestErrors> run_router(std::string_view text);

 private:
  bool parse(std::string_view text, toml::table& root);  // false: the syntax error is in sink_
  const toml::table* section(const toml::table& root, std::string_view name, bool required);
  const toml::array* table_array(const toml::node* node, Pos pos, const std::string& key);
  void read_sections(const toml::table& root);
  void read_cluster(const toml::table& table);
  void read_admin(const toml::table& table);
  void read_node_hosts(TableReader& reader, Node& node);
  void check_security();
  std::string absolute_path(const std::string& path) const;
  void read_fabric(const toml::table& table);
  void read_membership(const toml::table& table);
  void read_supervisor(const toml::table& table);
  void read_logging(const toml::table& table);
  void read_model(const toml::table& table);
  void read_served_names(TableReader& reader);
  void read_router(const toml::table& table);
  void read_kv_offload(const toml::table& table);
  void read_speculative(const toml::table& table);
  void read_gateway(const toml::table& table);
  void read_api_keys(TableReader& reader);
  void read_prefill(const toml::table& table);
  void check_prefill_step(const toml::table* table);
  void read_decode(const toml::table& table);
  void read_sim(const toml::table& table);
  void read_rbln(const toml::table& table);
  void read_rbln_parallel(TableReader& reader);
  void check_rbln();
  void check_rbln_split(const Instance& inst, const InstanceDecl& decl, bool serves_prefill,
                        bool serves_decode);
  Pos prefill_artifacts_pos_;  // of [rbln] prefill_artifacts, for check_rbln
  Pos pipeline_stages_pos_;    // of [rbln] prefill_pipeline_stages
  Pos data_parallel_pos_;      // of [rbln] decode_data_parallel
  std::vector<std::pair<std::string, double>> read_sim_numbers(const toml::table& table,
                                                               const std::string& path);
  void read_node(const toml::table& table, size_t index);
  void read_instance(const toml::table& table, std::string path, size_t node_index,
                     bool top_level);
  void read_role_keys(TableReader& reader, InstanceDecl& decl);
  void read_executor_keys(TableReader& reader, InstanceDecl& decl);
  void read_devices(TableReader& reader, InstanceDecl& decl);
  size_t resolve_node(TableReader& reader);
  void expand();
  void check_names();
  void check_ports();
  void check_executors();
  void check_executor_use(size_t node_index, size_t instance_index,
                          std::map<std::string, std::string>& served_by);
  void check_devices();
  void check_nodes();
  void check_roles();

  Sink sink_;
  Manifest manifest_;
  std::vector<NodeDecl> node_decls_;             // parallel to manifest_.nodes
  std::vector<InstanceDecl> decls_;
  std::vector<std::vector<Origin>> origins_;    // [node][instance]
  bool roles_known_ = true;                     // every instance table's role parsed
  bool block_tokens_ok_ = false;                // model.block_tokens read and valid
  bool context_ok_ = false;                     // ... and max_model_tokens too
  bool prefill_step_ok_ = true;                 // prefill.step_tokens_max (or its default)
};

bool Loader::parse(std::string_view text, toml::table& root) {
  try {
    root = toml::parse(text, std::string_view(sink_.file()));
    return true;
  } catch (const toml::parse_error& error) {
    sink_.add(pos_of(error.source()), "syntax", std::string(error.description()));
    return false;
  }
}

std::variant<Manifest, ManifestErrors> Loader::run(std::string_view text) {
  toml::table root;
  if (!parse(text, root)) return sink_.take();
  read_sections(root);
  expand();
  check_names();
  check_ports();
  check_executors();
  check_devices();
  check_rbln();
  check_nodes();
  check_roles();
  check_security();
  if (!sink_.empty()) return sink_.take();
  RT_ASSERT(!manifest_.nodes.empty(), "a valid manifest has nodes");
  RT_ASSERT(!manifest_.cluster.name.empty(), "a valid manifest has a cluster name");
  return std::move(manifest_);
}

const toml::table* Loader::section(const toml::table& root, std::string_view name,
                                   bool required) {
  const toml::node* node = root.get(name);
  if (!node) {
    if (required) sink_.add({}, std::string(name), "missing required section [" +
                                                       std::string(name) + "]");
    return nullptr;
  }
  if (!node->is_table()) {
    sink_.add(pos_of(node->source()), std::string(name),
              "expected a table [" + std::string(name) + "], got " + type_name(node->type()));
    return nullptr;
  }
  return node->as_table();
}

// An array of tables ([[x]]), or nullptr (absent, or reported as the wrong type).
const toml::array* Loader::table_array(const toml::node* node, Pos pos, const std::string& key) {
  if (!node) return nullptr;
  const toml::array* array = node->as_array();
  if (array && (array->empty() || array->is_array_of_tables())) return array;
  sink_.add(node->source().begin ? pos_of(node->source()) : pos, key,
            "expected an array of tables [[" + key + "]], got " + type_name(node->type()));
  return nullptr;
}

void Loader::read_sections(const toml::table& root) {
  TableReader reader(
      sink_, root, "",
      {"cluster", "admin", "fabric", "membership", "supervisor", "logging", "model", "router",
       "kv_offload", "speculative", "gateway", "prefill", "decode", "sim", "rbln", "node",
       "instance"});
  if (auto* t = section(root, "cluster", true)) read_cluster(*t);
  if (auto* t = section(root, "admin", false)) read_admin(*t);
  if (auto* t = section(root, "fabric", false)) read_fabric(*t);
  if (auto* t = section(root, "membership", false)) read_membership(*t);
  if (auto* t = section(root, "supervisor", false)) read_supervisor(*t);
  if (auto* t = section(root, "logging", false)) read_logging(*t);
  if (auto* t = section(root, "model", true)) read_model(*t);
  if (auto* t = section(root, "router", false)) read_router(*t);
  if (auto* t = section(root, "kv_offload", false)) read_kv_offload(*t);
  if (auto* t = section(root, "speculative", false)) read_speculative(*t);
  // After [model]: [prefill] and the executors' kv_blocks are checked against its sizes.
  if (auto* t = section(root, "gateway", false)) read_gateway(*t);
  const toml::table* prefill = section(root, "prefill", false);
  if (prefill) read_prefill(*prefill);
  if (!prefill && root.get("prefill")) prefill_step_ok_ = false;  // reported as not a table
  check_prefill_step(prefill);
  if (auto* t = section(root, "decode", false)) read_decode(*t);
  if (auto* t = section(root, "sim", false)) read_sim(*t);
  if (auto* t = section(root, "rbln", false)) read_rbln(*t);
  if (const toml::array* nodes = table_array(root.get("node"), {}, "node")) {
    for (size_t i = 0; i < nodes->size(); ++i) read_node(*nodes->get(i)->as_table(), i);
  }
  // Top-level [[instance]] tables join the node they name, so they come after all nodes.
  if (const toml::array* instances = table_array(root.get("instance"), {}, "instance")) {
    for (size_t i = 0; i < instances->size(); ++i) {
      read_instance(*instances->get(i)->as_table(), "instance[" + std::to_string(i) + "]",
                    no_index, true);
    }
  }
}

std::string Loader::absolute_path(const std::string& path) const {
  fs::path p(path);
  if (p.is_relative()) p = fs::path(manifest_.dir) / p;
  return p.lexically_normal().string();
}

void Loader::read_cluster(const toml::table& table) {
  TableReader reader(sink_, table, "cluster",
                     {"name", "protocol_version", "key_file", "accept_key_files"});
  reader.read_name("name", manifest_.cluster.name);
  ClusterSection& cluster = manifest_.cluster;
  if (reader.read_string("key_file", cluster.key_file, reader.find("key_file") != nullptr) &&
      !cluster.key_file.empty()) {
    cluster.key_file = absolute_path(cluster.key_file);
  }
  if (reader.read_string_list("accept_key_files", cluster.accept_key_files)) {
    for (auto& file : cluster.accept_key_files) file = absolute_path(file);
    if (!cluster.accept_key_files.empty() && cluster.key_file.empty()) {
      reader.issue("accept_key_files", "accepting other keys needs key_file (the key this "
                                       "cluster connects with)");
    }
  }
  uint32_t version = protocol_version_current;
  if (reader.read_int("protocol_version", 0, std::numeric_limits<int32_t>::max(), version) &&
      version != protocol_version_current) {
    reader.issue("protocol_version", "unsupported protocol_version " + std::to_string(version) +
                                         "; this build speaks " +
                                         std::to_string(protocol_version_current));
  }
}

void Loader::read_admin(const toml::table& table) {
  TableReader reader(sink_, table, "admin", {"token_file", "http_token_required"});
  AdminSection& admin = manifest_.admin;
  if (reader.read_string("token_file", admin.token_file, reader.find("token_file") != nullptr) &&
      !admin.token_file.empty()) {
    admin.token_file = absolute_path(admin.token_file);
  }
  if (reader.read_bool("http_token_required", admin.http_token_required) &&
      admin.http_token_required && admin.token_file.empty()) {
    reader.issue("http_token_required", "needs token_file (the token the requests present)");
  }
}

void Loader::read_fabric(const toml::table& table) {
  TableReader reader(sink_, table, "fabric",
                     {"provider", "send_queue_max", "sends_inflight_max", "frame_bytes_max",
                      "recv_buffers",
                      "rma_chunk_bytes", "rma_inflight_max", "connect_timeout_ms", "spin_us"});
  FabricSection& fabric = manifest_.fabric;
  size_t provider_index = no_index;
  if (reader.read_one_of("provider", providers, provider_index) && provider_index != no_index) {
    fabric.provider = std::string(providers[provider_index]);
  }
  reader.read_int("send_queue_max", 1, 1 << 20, fabric.send_queue_max);
  reader.read_int("sends_inflight_max", 1, 4096, fabric.sends_inflight_max);
  reader.read_int("frame_bytes_max", 4 << 10, 64 << 20, fabric.frame_bytes_max);
  reader.read_int("recv_buffers", 1, 4096, fabric.recv_buffers);
  reader.read_int("rma_chunk_bytes", 4 << 10, 1 << 30, fabric.rma_chunk_bytes);
  reader.read_int("rma_inflight_max", 1, 1024, fabric.rma_inflight_max);
  reader.read_int("connect_timeout_ms", 10, 600000, fabric.connect_timeout_ms);
  reader.read_int("spin_us", 0, 1000000, fabric.spin_us);
}

void Loader::read_supervisor(const toml::table& table) {
  TableReader reader(sink_, table, "supervisor",
                     {"restarts_max", "restart_window_ms", "restart_delay_ms", "drain_timeout_ms",
                      "executor_step_timeout_ms", "executor_open_timeout_ms", "device_lost",
                      "device_lost_restarts_max", "device_lost_window_ms"});
  reader.read_int("restarts_max", 1, 1000, manifest_.supervisor.restarts_max);
  reader.read_int("restart_window_ms", 100, 3'600'000, manifest_.supervisor.restart_window_ms);
  reader.read_int("restart_delay_ms", 0, 60'000, manifest_.supervisor.restart_delay_ms);
  reader.read_int("drain_timeout_ms", 0, 3'600'000, manifest_.supervisor.drain_timeout_ms);
  reader.read_int("executor_step_timeout_ms", 100, 3'600'000,
                  manifest_.supervisor.executor_step_timeout_ms);
  reader.read_int("executor_open_timeout_ms", 100, 3'600'000,
                  manifest_.supervisor.executor_open_timeout_ms);
  reader.read_enum("device_lost", device_lost_actions_all, manifest_.supervisor.device_lost);
  reader.read_int("device_lost_restarts_max", 1, 100,
                  manifest_.supervisor.device_lost_restarts_max);
  reader.read_int("device_lost_window_ms", 1000, 7 * 24 * 3'600'000,
                  manifest_.supervisor.device_lost_window_ms);
  if (manifest_.supervisor.device_lost == DeviceLostAction::stay) {
    for (std::string_view key : {"device_lost_restarts_max", "device_lost_window_ms"}) {
      if (reader.find(key)) {
        reader.issue(key,
                     "bounds the restarts of device_lost = \"restart-node\"; with "
                     "device_lost = \"stay\" a lost device never restarts the node");
      }
    }
  }
}

void Loader::read_membership(const toml::table& table) {
  TableReader reader(sink_, table, "membership", {"heartbeat_interval_ms", "heartbeat_miss_max"});
  reader.read_int("heartbeat_interval_ms", 10, 60000, manifest_.membership.heartbeat_interval_ms);
  reader.read_int("heartbeat_miss_max", 1, 100, manifest_.membership.heartbeat_miss_max);
}

void Loader::read_logging(const toml::table& table) {
  TableReader reader(sink_, table, "logging", {"level"});
  size_t index = no_index;
  if (reader.read_one_of("level", log_levels, index) && index != no_index) {
    manifest_.logging.level = std::string(log_levels[index]);
  }
}

void Loader::read_model(const toml::table& table) {
  TableReader reader(sink_, table, "model",
                     {"name", "served_names", "path", "block_tokens", "sub_block_tokens",
                      "max_model_tokens", "chat_format"});
  ModelSection& model = manifest_.model;
  reader.read_string("name", model.name, true);
  read_served_names(reader);
  if (reader.read_string("path", model.path, true)) {
    fs::path path(model.path);
    if (path.is_relative()) path = fs::path(manifest_.dir) / path;
    model.path = path.lexically_normal().string();
  }
  bool block_ok = reader.read_int("block_tokens", 1, 65536, model.block_tokens);
  if (block_ok && (model.block_tokens & (model.block_tokens - 1)) != 0) {
    reader.issue("block_tokens",
                 "value " + std::to_string(model.block_tokens) + " is not a power of two");
    block_ok = false;
  }
  model.sub_block_tokens = model.block_tokens > 512 ? 512 : model.block_tokens;
  if (reader.read_int("sub_block_tokens", 1, 65536, model.sub_block_tokens) && block_ok) {
    uint32_t sub = model.sub_block_tokens;
    if ((sub & (sub - 1)) != 0 || sub > model.block_tokens) {
      reader.issue("sub_block_tokens", "value " + std::to_string(sub) +
                                           " must be a power of two at most block_tokens (" +
                                           std::to_string(model.block_tokens) + ")");
      model.sub_block_tokens = model.block_tokens;
    }
  }
  bool max_ok = reader.read_int("max_model_tokens", 1, 1 << 24, model.max_model_tokens);
  block_tokens_ok_ = block_ok;
  context_ok_ = block_ok && max_ok && model.max_model_tokens >= model.block_tokens;
  if (block_ok && max_ok && model.max_model_tokens < model.block_tokens) {
    reader.issue(reader.find("max_model_tokens") ? "max_model_tokens" : "block_tokens",
                 "max_model_tokens (" + std::to_string(model.max_model_tokens) +
                     ") must be at least block_tokens (" + std::to_string(model.block_tokens) +
                     ")");
  }
  reader.read_enum("chat_format", chat_formats_all, model.chat_format);
}

// served_names = ["...", ...]: non-empty strings, distinct, none equal to [model] name.
// Each bad element is reported at its own place.
void Loader::read_served_names(TableReader& reader) {
  const toml::node* node = reader.find("served_names");
  if (!node) return;
  const toml::array* array = node->as_array();
  if (!array) {
    reader.issue("served_names", "expected an array of strings (model ids), got " +
                                     type_name(node->type()));
    return;
  }
  const std::string& primary = manifest_.model.name;
  std::vector<std::string> names;
  std::string key = reader.key("served_names");
  size_t bad_count = 0;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    std::string element_key = key + "[" + std::to_string(i) + "]";
    std::string problem;
    if (!element.is_string()) {
      problem = "expected a string (a model id), got " + type_name(element.type());
    } else if (element.as_string()->get().empty()) {
      problem = "a served model name must not be empty";
    } else if (element.as_string()->get() == primary) {
      problem = "'" + primary + "' is already the model's name (model.name)";
    } else if (std::find(names.begin(), names.end(), element.as_string()->get()) != names.end()) {
      problem = "'" + element.as_string()->get() + "' is listed twice";
    }
    if (!problem.empty()) {
      sink_.add(pos_of(element.source()), element_key, problem);
      ++bad_count;
      continue;
    }
    names.push_back(element.as_string()->get());
  }
  RT_ASSERT(names.size() + bad_count == array->size(), key);
  if (bad_count == 0) manifest_.model.served_names = std::move(names);
}

void Loader::read_router(const toml::table& table) {
  TableReader reader(sink_, table, "router",
                     {"policy", "weight_prefix", "weight_queue", "weight_kv_usage",
                      "prefix_index_blocks_max", "disaggregate_tokens_min", "load_imbalance_max",
                      "prefill_load_imbalance_max", "prefill_by_work", "tier2_weight",
                      "tier2_remote_weight", "tier2_index_blocks_max", "kv_resync_interval_ms",
                      "kv_index"});
  RouterSection& router = manifest_.router;
  constexpr double weight_max = 1e6;
  reader.read_enum("policy", router_policies_all, router.policy);
  reader.read_enum("kv_index", kv_index_modes_all, router.kv_index);
  bool weights_ok = reader.read_double("weight_prefix", 0.0, weight_max, router.weight_prefix);
  weights_ok &= reader.read_double("weight_queue", 0.0, weight_max, router.weight_queue);
  weights_ok &= reader.read_double("weight_kv_usage", 0.0, weight_max, router.weight_kv_usage);
  if (weights_ok && router.weight_prefix == 0.0 && router.weight_queue == 0.0 &&
      router.weight_kv_usage == 0.0) {
    reader.issue("weight_prefix",
                 "weight_prefix, weight_queue and weight_kv_usage are all zero; at least one "
                 "must be positive");
  }
  reader.read_int("prefix_index_blocks_max", 1, 100000000, router.prefix_index_blocks_max);
  reader.read_int("disaggregate_tokens_min", 0, std::numeric_limits<int32_t>::max(),
                  router.disaggregate_tokens_min);
  reader.read_double("load_imbalance_max", 0.0, 1e6, router.load_imbalance_max);
  reader.read_double("prefill_load_imbalance_max", 0.0, 1e6, router.prefill_load_imbalance_max);
  reader.read_bool("prefill_by_work", router.prefill_by_work);
  bool tier2_ok = reader.read_double("tier2_weight", 0.0, 1.0, router.tier2_weight);
  if (reader.find("tier2_remote_weight")) {
    if (reader.read_double("tier2_remote_weight", 0.0, 1.0, router.tier2_remote_weight) &&
        tier2_ok && router.tier2_remote_weight > router.tier2_weight) {
      reader.issue("tier2_remote_weight",
                   "tier2_remote_weight (" + std::to_string(router.tier2_remote_weight) +
                       ") must not exceed tier2_weight (" + std::to_string(router.tier2_weight) +
                       "): a copy on another node is never worth more than one on the "
                       "prefill instance's own");
    }
  } else {
    router.tier2_remote_weight = std::min(router.tier2_remote_weight, router.tier2_weight);
  }
  reader.read_int("tier2_index_blocks_max", 1, 100000000, router.tier2_index_blocks_max);
  reader.read_int("kv_resync_interval_ms", 10, 600000, router.kv_resync_interval_ms);
}

void Loader::read_kv_offload(const toml::table& table) {
  TableReader reader(sink_, table, "kv_offload",
                     {"enabled", "path", "capacity_bytes", "host_cache_bytes", "staging_blocks",
                      "stores_max", "lookups_max", "lookup_blocks_max", "hold_timeout_ms",
                      "lookup_timeout_ms", "partial_blocks"});
  KvOffloadSection& kv = manifest_.kv_offload;
  constexpr int64_t bytes_max = std::numeric_limits<int64_t>::max();
  reader.read_bool("enabled", kv.enabled);
  if (reader.read_string("path", kv.path) && !kv.path.empty()) {
    fs::path path(kv.path);
    if (path.is_relative()) path = fs::path(manifest_.dir) / path;
    kv.path = path.lexically_normal().string();
  }
  if (kv.enabled && !reader.find("path")) {
    reader.issue("path", "required when kv_offload.enabled is true");
  } else if (kv.enabled && reader.find("path") && kv.path.empty()) {
    reader.issue("path", "must not be empty when kv_offload.enabled is true");
  }
  reader.read_int("capacity_bytes", 4096, bytes_max, kv.capacity_bytes);
  reader.read_int("host_cache_bytes", 0, bytes_max, kv.host_cache_bytes);
  reader.read_int("staging_blocks", 1, 65536, kv.staging_blocks);
  reader.read_int("stores_max", 1, 65536, kv.stores_max);
  reader.read_int("lookups_max", 1, 65536, kv.lookups_max);
  reader.read_int("lookup_blocks_max", 1, 1000000, kv.lookup_blocks_max);
  reader.read_int("hold_timeout_ms", 100, 3600000, kv.hold_timeout_ms);
  reader.read_int("lookup_timeout_ms", 10, 600000, kv.lookup_timeout_ms);
  reader.read_bool("partial_blocks", kv.partial_blocks);
}

void Loader::read_speculative(const toml::table& table) {
  static constexpr const char* ngram_keys[] = {"ngram_match_min", "ngram_match_max",
                                               "ngram_candidates_max"};
  static constexpr const char* suffix_keys[] = {
      "suffix_depth_max",         "suffix_probability_min", "suffix_match_factor",
      "suffix_request_nodes_max", "suffix_cache_nodes_max", "suffix_cache_tokens_max"};
  std::vector<std::string_view> keys{"method", "draft_tokens_max", "batch_max", "row_cost",
                                     "draft_model"};
  keys.insert(keys.end(), std::begin(ngram_keys), std::end(ngram_keys));
  keys.insert(keys.end(), std::begin(suffix_keys), std::end(suffix_keys));
  TableReader reader(sink_, table, "speculative", keys);
  SpeculativeSection& spec = manifest_.speculative;
  reader.read_enum("method", speculative_methods_all, spec.method);
  // A key that does nothing is never accepted silently.
  if (reader.read_string("draft_model", spec.draft_model) && !spec.draft_model.empty()) {
    fs::path path(spec.draft_model);
    if (path.is_relative()) path = fs::path(manifest_.dir) / path;
    spec.draft_model = path.lexically_normal().string();
  }
  if (spec.method == SpeculativeMethod::eagle3 && !reader.find("draft_model")) {
    reader.issue("method", "\"eagle3\" needs draft_model (the EAGLE-3 head's directory)");
  } else if (spec.method == SpeculativeMethod::eagle3 && spec.draft_model.empty()) {
    reader.issue("draft_model", "must not be empty");
  } else if (spec.method != SpeculativeMethod::eagle3 && reader.find("draft_model")) {
    reader.issue("draft_model", std::string("applies to method \"eagle3\", and the method is \"") +
                                    std::string(to_string(spec.method)) + "\"");
  }
  auto refuse_unless = [&](SpeculativeMethod owner, std::span<const char* const> owned) {
    if (spec.method == owner) return;
    for (const char* key : owned) {
      if (reader.find(key)) {
        reader.issue(key, std::string("applies to method \"") + std::string(to_string(owner)) +
                              "\", and the method is \"" + std::string(to_string(spec.method)) +
                              "\"");
      }
    }
  };
  refuse_unless(SpeculativeMethod::ngram, ngram_keys);
  refuse_unless(SpeculativeMethod::suffix, suffix_keys);
  reader.read_int("draft_tokens_max", 1, 16, spec.draft_tokens_max);
  reader.read_int("batch_max", 1, 4096, spec.batch_max);
  if (reader.read_double("row_cost", 0.0, 4.0, spec.row_cost) && spec.row_cost <= 0.0) {
    reader.issue("row_cost", "must be above 0 (the cost of one more row in a decode pass)");
  }
  spec.row_cost_measured = reader.find("row_cost") == nullptr;
  reader.read_int("ngram_match_min", 1, 64, spec.ngram_match_min);
  if (reader.read_int("ngram_match_max", 1, 256, spec.ngram_match_max) &&
      spec.ngram_match_max < spec.ngram_match_min) {
    reader.issue("ngram_match_max", "ngram_match_max (" + std::to_string(spec.ngram_match_max) +
                                        ") must not be below ngram_match_min (" +
                                        std::to_string(spec.ngram_match_min) + ")");
  }
  reader.read_int("ngram_candidates_max", 1, 1024, spec.ngram_candidates_max);
  reader.read_int("suffix_depth_max", 1, 256, spec.suffix_depth_max);
  if (reader.read_double("suffix_probability_min", 0.0, 1.0, spec.suffix_probability_min) &&
      spec.suffix_probability_min <= 0.0) {
    reader.issue("suffix_probability_min", "must be above 0 (a draft stops below it)");
  }
  if (reader.read_double("suffix_match_factor", 0.0, 64.0, spec.suffix_match_factor) &&
      spec.suffix_match_factor <= 0.0) {
    reader.issue("suffix_match_factor", "must be above 0");
  }
  reader.read_int("suffix_request_nodes_max", 1, 1 << 26, spec.suffix_request_nodes_max);
  reader.read_int("suffix_cache_nodes_max", 1, 1 << 28, spec.suffix_cache_nodes_max);
  reader.read_int("suffix_cache_tokens_max", 1, int64_t{1} << 32, spec.suffix_cache_tokens_max);
}

void Loader::read_gateway(const toml::table& table) {
  TableReader reader(sink_, table, "gateway",
                     {"api_keys", "body_bytes_max", "connections_max", "requests_max", "queue_max",
                      "request_timeout_ms", "queue_timeout_ms", "header_timeout_ms",
                      "body_timeout_ms", "connections_per_client_max", "cache_secret",
                      "preparers", "long_prompt_preparers", "long_prompt_bytes",
                      "share_prefix_cache_across_keys", "allowed_hosts", "cors_origins"});
  GatewaySection& gateway = manifest_.gateway;
  reader.read_bool("share_prefix_cache_across_keys", gateway.share_prefix_cache_across_keys);
  if (reader.read_string_list("allowed_hosts", gateway.allowed_hosts)) {
    for (const auto& host : gateway.allowed_hosts) {
      if (host != "*" && !valid_host(host)) {
        reader.issue("allowed_hosts", "'" + host + "' is not a host name, an address or \"*\"");
      }
    }
  }
  if (reader.read_string_list("cors_origins", gateway.cors_origins)) {
    for (const auto& origin : gateway.cors_origins) {
      bool ok = origin == "*" || origin.rfind("http://", 0) == 0 || origin.rfind("https://", 0) == 0;
      if (!ok || origin.find_first_of(" \t\r\n,") != std::string::npos) {
        reader.issue("cors_origins", "'" + origin + "' is not an origin (scheme://host[:port]) "
                                     "or \"*\"");
      }
    }
  }
  read_api_keys(reader);
  reader.read_int("body_bytes_max", 1 << 10, 1 << 30, gateway.body_bytes_max);
  reader.read_int("connections_max", 1, 100000, gateway.connections_max);
  reader.read_int("requests_max", 1, 100000, gateway.requests_max);
  reader.read_int("queue_max", 0, 1000000, gateway.queue_max);
  reader.read_int("request_timeout_ms", 1000, 86400000, gateway.request_timeout_ms);
  reader.read_int("queue_timeout_ms", 100, 86400000, gateway.queue_timeout_ms);
  reader.read_int("header_timeout_ms", 100, 3600000, gateway.header_timeout_ms);
  reader.read_int("body_timeout_ms", 100, 86400000, gateway.body_timeout_ms);
  reader.read_int("connections_per_client_max", 1, 100000, gateway.connections_per_client_max);
  reader.read_string("cache_secret", gateway.cache_secret);
  reader.read_int("preparers", 1, 64, gateway.preparers);
  reader.read_int("long_prompt_preparers", 1, 64, gateway.long_prompt_preparers);
  reader.read_int("long_prompt_bytes", 1 << 10, 1 << 30, gateway.long_prompt_bytes);
}

// api_keys = ["...", ...]: every element a non-empty string; each bad element is reported.
void Loader::read_api_keys(TableReader& reader) {
  const toml::node* node = reader.find("api_keys");
  if (!node) return;
  const toml::array* array = node->as_array();
  if (!array) {
    reader.issue("api_keys", "expected an array of strings, got " + type_name(node->type()));
    return;
  }
  std::vector<std::string> keys;
  std::string key = reader.key("api_keys");
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    std::string element_key = key + "[" + std::to_string(i) + "]";
    if (!element.is_string()) {
      sink_.add(pos_of(element.source()), element_key,
                "expected a string, got " + type_name(element.type()));
    } else if (element.as_string()->get().empty()) {
      sink_.add(pos_of(element.source()), element_key, "an API key must not be empty");
    } else {
      keys.push_back(element.as_string()->get());
    }
  }
  RT_ASSERT(keys.size() <= array->size(), key);
  if (keys.size() == array->size()) manifest_.gateway.api_keys = std::move(keys);
}

void Loader::read_prefill(const toml::table& table) {
  TableReader reader(
      sink_, table, "prefill",
      {"queue_max", "running_max", "held_max", "step_tokens_max", "hold_timeout_ms"});
  PrefillSection& prefill = manifest_.prefill;
  reader.read_int("queue_max", 1, 1000000, prefill.queue_max);
  bool running_ok = reader.read_int("running_max", 1, 100000, prefill.running_max);
  bool held_ok = reader.read_int("held_max", 1, 1000000, prefill.held_max);
  if (running_ok && held_ok && prefill.running_max > prefill.held_max) {
    reader.issue(reader.find("held_max") ? "held_max" : "running_max",
                 "running_max (" + std::to_string(prefill.running_max) +
                     ") must not exceed held_max (" + std::to_string(prefill.held_max) +
                     "): running requests count toward the held ones");
  }
  prefill_step_ok_ = reader.read_int("step_tokens_max", 1, 1 << 24, prefill.step_tokens_max);
  reader.read_int("hold_timeout_ms", 100, 3600000, prefill.hold_timeout_ms);
}

// A prefill step holds at least one block: checked for the default too, so a large
// model.block_tokens without [prefill] is reported (placeless when the section is absent).
void Loader::check_prefill_step(const toml::table* table) {
  const ModelSection& model = manifest_.model;
  uint32_t step_tokens = manifest_.prefill.step_tokens_max;
  if (!prefill_step_ok_ || !block_tokens_ok_ || step_tokens >= model.block_tokens) return;
  RT_ASSERT(model.block_tokens > 1, "a step of >= 1 token holds a 1-token block");
  std::string message = "step_tokens_max (" + std::to_string(step_tokens) + ") must be at " +
                        "least model.block_tokens (" + std::to_string(model.block_tokens) + ")";
  const toml::node* node = table ? table->get("step_tokens_max") : nullptr;
  if (!node) message += "; the default is too small for this block size, set it in [prefill]";
  Pos pos = node ? pos_of(node->source()) : table ? pos_of(table->source()) : Pos{};
  sink_.add(pos, "prefill.step_tokens_max", std::move(message));
}

void Loader::read_decode(const toml::table& table) {
  TableReader reader(sink_, table, "decode",
                     {"waiting_max", "seqs_max", "step_tokens_max", "prefill_timeout_ms"});
  DecodeSection& decode = manifest_.decode;
  reader.read_int("waiting_max", 1, 1000000, decode.waiting_max);
  reader.read_int("seqs_max", 1, 100000, decode.seqs_max);
  reader.read_int("step_tokens_max", 1, 1 << 24, decode.step_tokens_max);
  reader.read_int("prefill_timeout_ms", 100, 3600000, decode.prefill_timeout_ms);
}

// [sim] is free-form (the sim device knows its names); every value must be a finite number.
void Loader::read_rbln(const toml::table& table) {
  TableReader reader(sink_, table, "rbln",
                     {"library", "artifacts", "compiler", "cache_dir", "prefill_artifacts",
                      "prefill_pipeline_stages", "prefill_stage_layers", "decode_data_parallel",
                      "prefill_chunk", "kv_element_bytes", "kv_memory"});
  RblnSection& rbln = manifest_.rbln;
  rbln.line = table.source().begin ? table.source().begin.line : 0;
  auto absolute = [&](std::string& path) {
    fs::path p(path);
    if (p.is_relative()) p = fs::path(manifest_.dir) / p;
    path = p.lexically_normal().string();
  };
  if (reader.read_string("library", rbln.library)) absolute(rbln.library);
  if (reader.read_string("artifacts", rbln.artifacts) && !rbln.artifacts.empty()) {
    absolute(rbln.artifacts);
  }
  if (reader.read_string("prefill_artifacts", rbln.prefill_artifacts) &&
      !rbln.prefill_artifacts.empty()) {
    absolute(rbln.prefill_artifacts);
    prefill_artifacts_pos_ = pos_of(table.get("prefill_artifacts")->source());
  }
  reader.read_string("compiler", rbln.compiler);
  rbln.cache_dir = "rbln-cache";
  reader.read_string("cache_dir", rbln.cache_dir);
  absolute(rbln.cache_dir);
  if (reader.read_int("prefill_chunk", 64, 65536, rbln.prefill_chunk) &&
      rbln.prefill_chunk % 64 != 0) {
    reader.issue("prefill_chunk",
                 "must be a multiple of 64, got " + std::to_string(rbln.prefill_chunk));
  }
  if (reader.read_int("kv_element_bytes", 1, 4, rbln.kv_element_bytes) &&
      rbln.kv_element_bytes == 3) {
    reader.issue("kv_element_bytes", "must be 1, 2 or 4, got 3");
  }
  static constexpr std::string_view kv_memories[] = {"host", "device"};
  size_t kv_memory = rbln.kv_on_device ? 1 : 0;
  if (reader.read_one_of("kv_memory", kv_memories, kv_memory)) rbln.kv_on_device = kv_memory == 1;
  if (!rbln.artifacts.empty() && !rbln.compiler.empty()) {
    reader.issue("compiler",
                 "set artifacts (a compiled directory) or compiler (the compile "
                 "cache), not both");
  }
  read_rbln_parallel(reader);
}

// [rbln] prefill_pipeline_stages, prefill_stage_layers and decode_data_parallel: shapes the
// compile cache compiles, so they need `compiler`; a compiled directory says its own.
void Loader::read_rbln_parallel(TableReader& reader) {
  RblnSection& rbln = manifest_.rbln;
  pipeline_stages_pos_ = reader.pos("prefill_pipeline_stages");
  data_parallel_pos_ = reader.pos("decode_data_parallel");
  reader.read_int("prefill_pipeline_stages", 1, 64, rbln.prefill_pipeline_stages);
  reader.read_int("decode_data_parallel", 1, 32, rbln.decode_data_parallel);
  if (const toml::node* node = reader.find("prefill_stage_layers")) {
    const toml::array* array = node->as_array();
    bool ok = array != nullptr && !array->empty();
    for (size_t i = 0; ok && i < array->size(); ++i) {
      std::optional<int64_t> v = array->get(i)->value_exact<int64_t>();
      ok = v && *v >= 1 && *v <= 65535;
      if (ok) rbln.prefill_stage_layers.push_back(static_cast<uint32_t>(*v));
    }
    if (!ok) {
      rbln.prefill_stage_layers.clear();
      reader.issue("prefill_stage_layers",
                   "expected a non-empty array of layer counts (integers 1..65535), one per "
                   "pipeline stage");
    } else if (rbln.prefill_stage_layers.size() != rbln.prefill_pipeline_stages) {
      reader.issue("prefill_stage_layers", "lists " +
                                               std::to_string(rbln.prefill_stage_layers.size()) +
                                               " stages, prefill_pipeline_stages is " +
                                               std::to_string(rbln.prefill_pipeline_stages));
    }
  }
  const bool parallel = rbln.prefill_pipeline_stages > 1 || rbln.decode_data_parallel > 1;
  if (parallel && rbln.compiler.empty()) {
    reader.issue(
        rbln.prefill_pipeline_stages > 1 ? "prefill_pipeline_stages" : "decode_data_parallel",
        "says what the compile cache compiles, and [rbln] compiler is not set; a "
        "compiled directory (artifacts, prefill_artifacts) carries its own "
        "pipeline_parallel_size or data_parallel_size in rbln_config.json");
  }
  if (rbln.prefill_pipeline_stages > 1 && !rbln.prefill_artifacts.empty()) {
    reader.issue("prefill_pipeline_stages",
                 "the prefill executors use prefill_artifacts, not the compile cache; set one "
                 "of the two");
  }
}

// Executors with device "rbln" need [rbln] artifacts (or the compile cache). A speculating
// decode instance on one needs verify graphs: the executor checks its artifact for them
// (devices/rbln/rbln_artifact.hpp), and the compile cache compiles them.
void Loader::check_rbln() {
  const RblnSection& rbln = manifest_.rbln;
  bool prefill_on_rbln = false, decode_on_rbln = false;
  for (size_t n = 0; n < manifest_.nodes.size(); ++n) {
    const auto& instances = manifest_.nodes[n].instances;
    for (size_t i = 0; i < instances.size(); ++i) {
      const Instance& inst = instances[i];
      if (inst.role != Role::executor || inst.device != DeviceKind::rbln) continue;
      const InstanceDecl& decl = decls_[origins_[n][i].decl_index];
      const bool serves_prefill =
          std::any_of(instances.begin(), instances.end(), [&](const Instance& user) {
            return user.role == Role::prefill && user.executor == inst.name;
          });
      const bool serves_decode =
          std::any_of(instances.begin(), instances.end(), [&](const Instance& user) {
            return user.role == Role::decode && user.executor == inst.name;
          });
      prefill_on_rbln = prefill_on_rbln || serves_prefill;
      decode_on_rbln = decode_on_rbln || serves_decode;
      check_rbln_split(inst, decl, serves_prefill, serves_decode);
      const bool has_prefill_dir = serves_prefill && !rbln.prefill_artifacts.empty();
      if (rbln.artifacts.empty() && rbln.compiler.empty() && !has_prefill_dir) {
        sink_.add(decl.pos, decl.path + ".device",
                  "executor '" + inst.name +
                      "' has device \"rbln\": [rbln] artifacts (the compiled model directory) "
                      "or compiler (the compile cache) must be set" +
                      (serves_prefill ? " (or prefill_artifacts, for prefill executors)" : ""));
        return;
      }
    }
  }
  if (!rbln.prefill_artifacts.empty() && !prefill_on_rbln) {
    sink_.add(prefill_artifacts_pos_, "rbln.prefill_artifacts",
              "no prefill instance runs on an executor with device \"rbln\", so "
              "prefill_artifacts would be unused");
  }
  if (rbln.prefill_pipeline_stages > 1 && !prefill_on_rbln) {
    sink_.add(pipeline_stages_pos_, "rbln.prefill_pipeline_stages",
              "no prefill instance runs on an executor with device \"rbln\", so "
              "prefill_pipeline_stages would be unused");
  }
  if (rbln.decode_data_parallel > 1 && !decode_on_rbln) {
    sink_.add(data_parallel_pos_, "rbln.decode_data_parallel",
              "no decode instance runs on an executor with device \"rbln\", so "
              "decode_data_parallel would be unused");
  }
}

// An rbln executor's devices split into the compile cache's pipeline stages (prefill) or
// data-parallel ranks (decode), each of the same tensor-parallel width.
void Loader::check_rbln_split(const Instance& inst, const InstanceDecl& decl, bool serves_prefill,
                              bool serves_decode) {
  const RblnSection& rbln = manifest_.rbln;
  const size_t devices = inst.device_ids.size();
  auto refuse_split = [&](uint32_t parts, const std::string& key, const char* what) {
    if (parts <= 1 || devices % parts == 0) return;
    sink_.add(decl.devices_pos, decl.path + ".devices",
              "executor '" + inst.name + "' has " + std::to_string(devices) +
                  (devices == 1 ? " device" : " devices") + ", which do not split into [rbln] " +
                  key + " = " + std::to_string(parts) + " " + what +
                  " of equal tensor-parallel width (list a multiple of " + std::to_string(parts) +
                  " devices)");
  };
  // (An executor serves one prefill or decode instance, so never both.)
  if (serves_prefill && rbln.prefill_artifacts.empty()) {
    refuse_split(rbln.prefill_pipeline_stages, "prefill_pipeline_stages", "pipeline stages");
  }
  if (serves_decode) {
    refuse_split(rbln.decode_data_parallel, "decode_data_parallel", "data-parallel ranks");
  }
}

void Loader::read_sim(const toml::table& table) {
  manifest_.sim.params = read_sim_numbers(table, "sim");
}

// name -> number pairs of a sim parameter table; bad values are reported under `path`.
std::vector<std::pair<std::string, double>> Loader::read_sim_numbers(const toml::table& table,
                                                                     const std::string& path) {
  std::vector<std::pair<std::string, double>> params;
  size_t bad_count = 0;
  for (auto&& [name, node] : table) {
    std::string key = join_key(path, name.str());
    std::optional<double> value;
    if (node.is_integer()) value = static_cast<double>(node.as_integer()->get());
    if (node.is_floating_point()) value = node.as_floating_point()->get();
    if (!value) {
      sink_.add(pos_of(node.source()), key,
                "expected a number (integer or float), got " + type_name(node.type()));
    } else if (!std::isfinite(*value)) {
      sink_.add(pos_of(node.source()), key, "must be a finite number (not inf or nan)");
      value.reset();
    }
    if (value && name.str() == "reasoning_share" &&
        manifest_.model.chat_format == ChatFormat::plain) {
      // A key that would do nothing: the plain format has no reasoning to end.
      sink_.add(pos_of(node.source()), key,
                "reasoning_share applies to a chat format with reasoning (chatml, minimax-m2); "
                "model.chat_format is plain");
      value.reset();
    }
    if (value) {
      params.emplace_back(std::string(name.str()), *value);
    } else {
      ++bad_count;
    }
  }
  RT_ASSERT(params.size() + bad_count == table.size(), "sim params lost");
  return params;
}

void Loader::read_node(const toml::table& table, size_t index) {
  std::string path = "node[" + std::to_string(index) + "]";
  TableReader reader(sink_, table, path,
                     {"name", "host", "fabric_port", "admin_port", "http_port", "workers",
                      "instance", "api_host", "fabric_host", "admin_host"});
  Node node;
  node.line = reader.pos().line;
  NodeDecl decl{path, reader.pos(), reader.pos("name"),
                {reader.pos("fabric_port"), reader.pos("admin_port"), reader.pos("http_port")}};
  reader.read_name("name", node.name);
  read_node_hosts(reader, node);
  reader.read_int("fabric_port", 1, 65535, node.fabric_port, true);
  uint16_t port = 0;
  if (reader.find("admin_port") && reader.read_int("admin_port", 1, 65535, port)) {
    node.admin_port = port;
  }
  if (reader.find("http_port") && reader.read_int("http_port", 1, 65535, port)) {
    node.http_port = port;
  }
  uint32_t workers = 0;
  if (reader.find("workers") && reader.read_int("workers", 1, kWorkersMax, workers)) {
    node.workers = workers;
  }
  size_t node_index = manifest_.nodes.size();
  manifest_.nodes.push_back(std::move(node));
  node_decls_.push_back(std::move(decl));
  RT_ASSERT(manifest_.nodes.size() == node_decls_.size(), "node lists out of step");
  if (const toml::array* list =
          table_array(table.get("instance"), reader.pos(), reader.key("instance"))) {
    for (size_t i = 0; i < list->size(); ++i) {
      read_instance(*list->get(i)->as_table(), path + ".instance[" + std::to_string(i) + "]",
                    node_index, false);
    }
  }
}

// host (required: where peers reach the node) and the listen address of each plane.
void Loader::read_node_hosts(TableReader& reader, Node& node) {
  if (reader.read_string("host", node.host, true) && !valid_host(node.host)) {
    reader.issue("host", "'" + node.host + "' is not an IPv4 or IPv6 address or a host name");
    node.host.clear();
  }
  if (!node.host.empty() && is_wildcard_host(node.host)) {
    reader.issue("host", "'" + node.host + "' is where peers reach the node, so it cannot be "
                         "every interface; to listen on every interface set api_host, "
                         "fabric_host or admin_host");
    node.host.clear();
  }
  for (auto [key, field] : {std::pair{"api_host", &node.api_host},
                            std::pair{"fabric_host", &node.fabric_host},
                            std::pair{"admin_host", &node.admin_host}}) {
    if (reader.read_string(key, *field, reader.find(key) != nullptr) && !field->empty() &&
        !valid_host(*field)) {
      reader.issue(key, "'" + *field + "' is not an IPv4 or IPv6 address or a host name");
      field->clear();
    }
  }
  if (node.api_host.empty()) node.api_host = node.host;
  if (node.fabric_host.empty()) node.fabric_host = node.host;
  if (node.admin_host.empty()) {
    node.admin_host = node.host.empty() || is_loopback_host(node.host) ? node.host : "127.0.0.1";
  }
}

// Nodes on more than one host must name the cluster key: a key made on one host cannot reach
// the others, and an unkeyed fabric would be open to anyone on the network.
void Loader::check_security() {
  if (!manifest_.cluster.key_file.empty() || manifest_.nodes.empty()) return;
  if (manifest_.single_host()) return;
  std::string hosts;
  for (const auto& node : manifest_.nodes) {
    if (hosts.find(node.host) == std::string::npos) hosts += (hosts.empty() ? "" : ", ") + node.host;
  }
  sink_.add({}, "cluster.key_file",
            "required: the nodes are on more than one host (" + hosts +
                "); write one with `tandem keygen FILE` and copy it to every host (mode 0600)");
}

void Loader::read_instance(const toml::table& table, std::string path, size_t node_index,
                           bool top_level) {
  RT_ASSERT(top_level == (node_index == no_index), "top-level instances resolve their node");
  static constexpr std::array<std::string_view, 10> keys = {
      "node",      "role",    "name",     "count", "device", "devices",
      "kv_blocks", "threads", "executor", "sim"};
  // "node" only in top-level [[instance]] tables.
  auto known = top_level ? std::span(keys) : std::span(keys).subspan(1);
  TableReader reader(sink_, table, path, known);
  InstanceDecl decl;
  decl.path = path;
  decl.pos = reader.pos();
  decl.name_pos = reader.pos("name");
  decl.proto.line = decl.pos.line;
  bool role_ok = reader.read_enum("role", roles_all, decl.proto.role, true);
  roles_known_ = roles_known_ && role_ok;
  bool name_ok = reader.read_name("name", decl.proto.name);
  reader.read_int("count", 1, instance_count_max, decl.count);
  decl.node_index = top_level ? resolve_node(reader) : node_index;
  if (role_ok) read_role_keys(reader, decl);
  decl.usable = role_ok && name_ok && decl.node_index != no_index;
  decls_.push_back(std::move(decl));
}

// A top-level [[instance]] names its node; without one it is a role without a node.
size_t Loader::resolve_node(TableReader& reader) {
  std::string name;
  if (!reader.find("node")) {
    reader.issue("node", "role without a node: a top-level [[instance]] must name its node "
                         "(node = \"...\")");
    return no_index;
  }
  if (!reader.read_string("node", name, true)) return no_index;
  for (size_t i = 0; i < manifest_.nodes.size(); ++i) {
    if (manifest_.nodes[i].name == name) return i;
  }
  std::string known;
  std::set<std::string> names;
  for (const auto& node : manifest_.nodes) {
    if (names.insert(node.name).second) known += (known.empty() ? "" : ", ") + node.name;
  }
  reader.issue("node", "role without a node: no node named '" + name + "' (nodes: " +
                           (known.empty() ? std::string("none") : known) + ")");
  return no_index;
}

void Loader::read_role_keys(TableReader& reader, InstanceDecl& decl) {
  Role role = decl.proto.role;
  bool executor = role == Role::executor;
  bool needs_executor = role == Role::prefill || role == Role::decode;
  std::string role_text(to_string(role));
  for (std::string_view key : {"device", "devices", "kv_blocks", "threads", "sim"}) {
    if (!executor && reader.find(key)) {
      reader.issue(key, "only executor instances take '" + std::string(key) + "' (this is a " +
                            role_text + ")");
    }
  }
  if (!needs_executor && reader.find("executor")) {
    reader.issue("executor",
                 "only prefill and decode instances take 'executor' (this is a " + role_text +
                     ")");
  }
  if (executor) read_executor_keys(reader, decl);
  if (needs_executor) {
    decl.executor_pos = reader.pos("executor");
    if (!reader.find("executor")) {
      reader.issue("executor", "executor reference missing: a " + role_text +
                                   " instance names the executor instance (same node) that "
                                   "runs its batches");
    } else {
      reader.read_string("executor", decl.proto.executor, true);
    }
  }
}

// device, devices, kv_blocks, threads. The KV pool must hold one sequence at full context;
// checked also for the default kv_blocks (when the model's sizes are valid).
void Loader::read_executor_keys(TableReader& reader, InstanceDecl& decl) {
  RT_ASSERT(decl.proto.role == Role::executor, decl.path);
  Instance& proto = decl.proto;
  reader.read_enum("device", device_kinds_all, proto.device);
  read_devices(reader, decl);
  bool blocks_ok = reader.read_int("kv_blocks", 1, 1 << 24, proto.kv_blocks);
  reader.read_int("threads", 0, 1024, proto.threads);
  if (const toml::node* sim = reader.find("sim")) {
    if (!sim->is_table()) {
      reader.issue("sim", "expected a table of sim device parameters (e.g. sim = { dp_ep = 1 }), "
                          "got " + type_name(sim->type()));
    } else if (proto.device != DeviceKind::sim) {
      reader.issue("sim", "sim parameters apply to device = \"sim\" only (this executor's "
                          "device is " + std::string(to_string(proto.device)) + ")");
    } else {
      proto.sim = read_sim_numbers(*sim->as_table(), join_key(decl.path, "sim"));
    }
  }
  if (!blocks_ok || !context_ok_) return;
  const ModelSection& model = manifest_.model;
  RT_ASSERT(model.block_tokens >= 1, decl.path);
  uint64_t pool_tokens = uint64_t{proto.kv_blocks} * model.block_tokens;
  if (pool_tokens >= model.max_model_tokens) return;
  uint64_t needed_blocks = (model.max_model_tokens + model.block_tokens - 1) / model.block_tokens;
  std::string written = reader.find("kv_blocks") ? "" : " (the default)";
  reader.issue("kv_blocks",
               "kv_blocks " + std::to_string(proto.kv_blocks) + written + " x model.block_tokens " +
                   std::to_string(model.block_tokens) + " = " + std::to_string(pool_tokens) +
                   " tokens cannot hold one full-context sequence of model.max_model_tokens " +
                   std::to_string(model.max_model_tokens) + "; needs at least " +
                   std::to_string(needed_blocks) + " blocks");
}

// devices = [..]: split into `count` equal consecutive slices. Default: one device per
// instance, indices 0..count-1.
void Loader::read_devices(TableReader& reader, InstanceDecl& decl) {
  decl.devices_pos = reader.pos("devices");
  std::vector<uint32_t>& ids = decl.proto.device_ids;
  const toml::node* node = reader.find("devices");
  if (!node) {
    for (uint32_t i = 0; i < decl.count; ++i) ids.push_back(i);
    return;
  }
  const toml::array* array = node->as_array();
  if (!array) {
    reader.issue("devices", "expected an array of device indices, got " +
                                type_name(node->type()));
    return;
  }
  std::vector<uint32_t> read;
  std::string key = reader.key("devices");
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    std::optional<int64_t> value = element.value_exact<int64_t>();
    std::string element_key = key + "[" + std::to_string(i) + "]";
    if (!value || *value < 0 || *value > 65535) {
      sink_.add(pos_of(element.source()), element_key,
                "expected a device index (an integer 0..65535), got " +
                    (value ? std::to_string(*value) : type_name(element.type())));
      return;
    }
    if (std::find(read.begin(), read.end(), *value) != read.end()) {
      sink_.add(pos_of(element.source()), element_key,
                "device index " + std::to_string(*value) + " is listed twice");
      return;
    }
    read.push_back(static_cast<uint32_t>(*value));
  }
  if (read.empty()) {
    reader.issue("devices", "must list at least one device index");
  } else if (read.size() % decl.count != 0) {
    reader.issue("devices", std::to_string(read.size()) + " device indices do not split into " +
                                std::to_string(decl.count) + " equal slices (count = " +
                                std::to_string(decl.count) + ")");
  } else {
    ids = std::move(read);
  }
}

void Loader::expand() {
  origins_.assign(manifest_.nodes.size(), {});
  for (size_t d = 0; d < decls_.size(); ++d) {
    const InstanceDecl& decl = decls_[d];
    if (!decl.usable) continue;
    RT_ASSERT(decl.node_index < manifest_.nodes.size(), decl.path);
    RT_ASSERT(decl.count >= 1 && decl.count <= instance_count_max, decl.path);
    Node& node = manifest_.nodes[decl.node_index];
    size_t slice_count = decl.proto.device_ids.size() / decl.count;
    for (uint32_t copy = 0; copy < decl.count; ++copy) {
      Instance instance = decl.proto;
      if (decl.count > 1) {
        instance.name += "-" + std::to_string(copy);
        if (!instance.executor.empty()) instance.executor += "-" + std::to_string(copy);
      }
      auto first = decl.proto.device_ids.begin() + static_cast<ptrdiff_t>(copy * slice_count);
      instance.device_ids.assign(first, first + static_cast<ptrdiff_t>(slice_count));
      node.instances.push_back(std::move(instance));
      origins_[decl.node_index].push_back({d, copy});
    }
  }
}

void Loader::check_names() {
  std::map<std::string, size_t> nodes_by_name;
  for (size_t n = 0; n < manifest_.nodes.size(); ++n) {
    const std::string& name = manifest_.nodes[n].name;
    if (name.empty()) continue;
    auto [it, fresh] = nodes_by_name.emplace(name, n);
    if (fresh) continue;
    const NodeDecl& first = node_decls_[it->second];
    sink_.add(node_decls_[n].name_pos, node_decls_[n].path + ".name",
              "duplicate node name '" + name + "' (first used by " + first.path + " at line " +
                  std::to_string(first.pos.line) + ")");
  }
  std::map<std::string, const InstanceDecl*> instances_by_name;
  for (size_t n = 0; n < manifest_.nodes.size(); ++n) {
    for (size_t i = 0; i < manifest_.nodes[n].instances.size(); ++i) {
      const std::string& name = manifest_.nodes[n].instances[i].name;
      const InstanceDecl& decl = decls_[origins_[n][i].decl_index];
      auto [it, fresh] = instances_by_name.emplace(name, &decl);
      if (fresh) continue;
      sink_.add(decl.name_pos, decl.path + ".name",
                "duplicate instance name '" + name + "' (also " + it->second->path +
                    " at line " + std::to_string(it->second->pos.line) +
                    "; names are unique across the cluster after count expansion)");
    }
  }
}

// No two listeners on one host may share a port: fabric, admin and http of every node.
void Loader::check_ports() {
  std::map<std::pair<std::string, uint16_t>, std::pair<size_t, size_t>> used;  // -> node, key
  for (size_t n = 0; n < manifest_.nodes.size(); ++n) {
    const Node& node = manifest_.nodes[n];
    if (node.host.empty()) continue;
    std::array<std::optional<uint16_t>, 3> ports = {node.fabric_port, node.admin_port,
                                                    node.http_port};
    if (node.fabric_port == 0) ports[0].reset();
    for (size_t k = 0; k < ports.size(); ++k) {
      if (!ports[k]) continue;
      auto [it, fresh] = used.emplace(std::pair(node.host, *ports[k]), std::pair(n, k));
      if (fresh) continue;
      auto [other_node, other_key] = it->second;
      std::string owner = other_node == n
                              ? "this node's " + std::string(port_keys[other_key])
                              : "node '" + manifest_.nodes[other_node].name + "' (" +
                                    node_decls_[other_node].path + "." +
                                    std::string(port_keys[other_key]) + ")";
      sink_.add(node_decls_[n].port_pos[k], node_decls_[n].path + "." + std::string(port_keys[k]),
                node.host + ":" + std::to_string(*ports[k]) + " is already used by " + owner);
    }
  }
}

void Loader::check_executors() {
  std::map<std::string, std::string> served_by;  // executor name -> prefill/decode name
  for (size_t n = 0; n < manifest_.nodes.size(); ++n) {
    for (size_t i = 0; i < manifest_.nodes[n].instances.size(); ++i) {
      check_executor_use(n, i, served_by);
    }
  }
}

void Loader::check_executor_use(size_t node_index, size_t instance_index,
                                std::map<std::string, std::string>& served_by) {
  const Node& node = manifest_.nodes[node_index];
  const Instance& user = node.instances[instance_index];
  if (user.executor.empty()) return;
  RT_ASSERT(user.role == Role::prefill || user.role == Role::decode, user.name);
  const InstanceDecl& decl = decls_[origins_[node_index][instance_index].decl_index];
  std::string key = decl.path + ".executor";
  std::string who = decl.count > 1 ? "instance '" + user.name + "': " : "";
  const Node* target_node = nullptr;
  const Instance* target = nullptr;
  for (const auto& candidate_node : manifest_.nodes) {
    for (const auto& candidate : candidate_node.instances) {
      if (candidate.name == user.executor && !target) {
        target_node = &candidate_node;
        target = &candidate;
      }
    }
  }
  if (!target) {
    std::string hint = decl.count > 1 ? " (count " + std::to_string(decl.count) +
                                            " uses '<executor>-i' for instance i; the executor "
                                            "needs the same count)"
                                      : "";
    sink_.add(decl.executor_pos, key, who + "executor reference missing: no instance named '" +
                                          user.executor + "'" + hint);
  } else if (target->role != Role::executor) {
    sink_.add(decl.executor_pos, key, who + "'" + user.executor + "' is a " +
                                          std::string(to_string(target->role)) +
                                          " instance, not an executor");
  } else if (target_node != &node) {
    sink_.add(decl.executor_pos, key,
              who + "executor '" + user.executor + "' is on node '" + target_node->name +
                  "', not on this instance's node '" + node.name + "'");
  } else if (user.role == Role::decode &&
             manifest_.speculative.method == SpeculativeMethod::eagle3 &&
             target->device != DeviceKind::cpu) {
    sink_.add(decl.executor_pos, key,
              who + "speculative.method = \"eagle3\" runs its draft model beside the decode "
                    "instance's executor, and executor '" + user.executor + "' has device \"" +
                  std::string(to_string(target->device)) + "\" (EAGLE-3 runs on \"cpu\")");
  } else if (auto [it, fresh] = served_by.emplace(user.executor, user.name); !fresh) {
    sink_.add(decl.executor_pos, key,
              who + "executor '" + user.executor + "' already serves '" + it->second +
                  "'; each executor serves at most one prefill or decode instance");
  }
}

// Two executors on one node must not drive the same device.
void Loader::check_devices() {
  for (size_t n = 0; n < manifest_.nodes.size(); ++n) {
    std::map<std::pair<DeviceKind, uint32_t>, std::string> owner;
    const auto& instances = manifest_.nodes[n].instances;
    for (size_t i = 0; i < instances.size(); ++i) {
      if (instances[i].role != Role::executor) continue;
      for (uint32_t id : instances[i].device_ids) {
        auto [it, fresh] = owner.emplace(std::pair(instances[i].device, id), instances[i].name);
        if (fresh) continue;
        const InstanceDecl& decl = decls_[origins_[n][i].decl_index];
        sink_.add(decl.devices_pos, decl.path + ".devices",
                  "device " + std::string(to_string(instances[i].device)) + " " +
                      std::to_string(id) + " of '" + instances[i].name +
                      "' is already used by executor '" + it->second + "' on this node");
      }
    }
  }
}

void Loader::check_nodes() {
  for (const InstanceDecl& decl : decls_) {
    if (!decl.usable || decl.proto.role != Role::gateway) continue;
    const Node& node = manifest_.nodes[decl.node_index];
    if (node.http_port) continue;
    sink_.add(decl.pos, decl.path + ".role",
              "a gateway serves HTTP: its node '" + node.name + "' (" +
                  node_decls_[decl.node_index].path + ") must set http_port");
  }
  for (size_t n = 0; n < manifest_.nodes.size(); ++n) {
    if (!manifest_.nodes[n].instances.empty()) continue;
    bool has_declared = std::any_of(decls_.begin(), decls_.end(),
                                    [n](const InstanceDecl& d) { return d.node_index == n; });
    if (has_declared) continue;  // its instances had errors, already reported
    sink_.add(node_decls_[n].pos, node_decls_[n].path,
              "node '" + manifest_.nodes[n].name + "' has no instances");
  }
}

// The cluster can serve only with a gateway, a router, someone to prefill and a decoder.
// Skipped when an instance's role did not parse: the gap might be that typo.
void Loader::check_roles() {
  if (manifest_.nodes.empty()) {
    sink_.add({}, "node", "the manifest declares no nodes; add at least one [[node]]");
    return;
  }
  if (!roles_known_) return;
  auto count = [this](Role role) { return manifest_.instances_of(role).size(); };
  if (count(Role::gateway) == 0) {
    sink_.add({}, "node", "no gateway instance: the cluster needs at least one");
  }
  if (count(Role::router) == 0) {
    sink_.add({}, "node", "no router instance: the cluster needs at least one");
  }
  if (count(Role::prefill) + count(Role::decode) == 0) {
    sink_.add({}, "node",
              "no prefill-capable instance (prefill or decode): the cluster needs at least one");
  }
  if (count(Role::decode) == 0) {
    sink_.add({}, "node", "no decode instance: the cluster needs at least one");
  }
}

// The directory relative paths resolve against: the file's, made absolute.
std::string manifest_dir(const std::string& file) {
  std::error_code error;
  fs::path dir = fs::path(file).parent_path();
  fs::path absolute = fs::absolute(dir.empty() ? fs::path(".") : dir, error);
  return (error ? dir : absolute).lexically_normal().string();
}

}  // namespace

std::variant<RouterSection, ManifestErrors> Loader::run_router(std::string_view text) {
  toml::table root;
  if (!parse(text, root)) return sink_.take();
  read_router(root);
  if (!sink_.empty()) return sink_.take();
  return manifest_.router;
}

namespace {

// The shortest text that reads back as `v` (0.8, not 0.80000000000000004).
std::string toml_double(double v) {
  char buf[64];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string out = buf;
  if (out.find_first_of(".eEn") == std::string::npos) out += ".0";
  return out;
}

// The section as TOML lines, key -> value text.
std::vector<std::pair<std::string, std::string>> router_values(const RouterSection& r) {
  auto quoted = [](std::string_view v) { return "\"" + std::string(v) + "\""; };
  return {{"policy", quoted(to_string(r.policy))},
          {"weight_prefix", toml_double(r.weight_prefix)},
          {"weight_queue", toml_double(r.weight_queue)},
          {"weight_kv_usage", toml_double(r.weight_kv_usage)},
          {"disaggregate_tokens_min", std::to_string(r.disaggregate_tokens_min)},
          {"load_imbalance_max", toml_double(r.load_imbalance_max)},
          {"prefill_load_imbalance_max", toml_double(r.prefill_load_imbalance_max)},
          {"prefill_by_work", r.prefill_by_work ? "true" : "false"},
          {"tier2_weight", toml_double(r.tier2_weight)},
          {"tier2_remote_weight", toml_double(r.tier2_remote_weight)},
          {"prefix_index_blocks_max", std::to_string(r.prefix_index_blocks_max)},
          {"tier2_index_blocks_max", std::to_string(r.tier2_index_blocks_max)},
          {"kv_resync_interval_ms", std::to_string(r.kv_resync_interval_ms)},
          {"kv_index", quoted(to_string(r.kv_index))}};
}

constexpr std::string_view router_fixed_keys[] = {
    "prefix_index_blocks_max", "tier2_index_blocks_max", "kv_resync_interval_ms", "kv_index"};

}  // namespace

std::vector<std::pair<std::string, std::string>> router_settings(const RouterSection& router) {
  auto all = router_values(router);
  std::erase_if(all, [](const auto& kv) {
    return std::find(std::begin(router_fixed_keys), std::end(router_fixed_keys), kv.first) !=
           std::end(router_fixed_keys);
  });
  return all;
}

Result<RouterSection> set_router_key(const RouterSection& current, const std::string& key,
                                     const std::string& value) {
  auto all = router_values(current);
  bool fixed = std::find(std::begin(router_fixed_keys), std::end(router_fixed_keys), key) !=
               std::end(router_fixed_keys);
  if (fixed) {
    return make_error(ErrorKind::invalid, "router." + key +
                                              " is fixed when a router starts; change it in the "
                                              "manifest and restart the router's node");
  }
  auto it = std::find_if(all.begin(), all.end(), [&](const auto& kv) { return kv.first == key; });
  if (it == all.end()) {
    std::string known;
    for (const auto& [name, v] : router_settings(current))
      known += (known.empty() ? "" : ", ") + name;
    return make_error(ErrorKind::invalid,
                      "router." + key + " is not a router setting; settable: " + known);
  }
  auto attempt = [&](const std::string& text) {
    it->second = text;
    std::string body;
    for (const auto& [name, v] : all) body += name + " = " + v + "\n";
    Loader loader("router set", "");
    return loader.run_router(body);
  };
  auto read = attempt(value);
  auto* errors = std::get_if<ManifestErrors>(&read);
  // A bare word for a string setting (policy = round-robin) is taken as that string.
  if (errors && errors->issues.size() == 1 && errors->issues[0].key == "syntax") {
    read = attempt("\"" + value + "\"");
    errors = std::get_if<ManifestErrors>(&read);
    if (errors && errors->issues[0].key == "syntax") {
      return make_error(
          ErrorKind::invalid,
          "router." + key + ": '" + value + "' is not a value (a number, true/false or a word)");
    }
  }
  if (errors) {
    std::string why;
    for (const auto& issue : errors->issues) {
      why += (why.empty() ? "" : "; ") + issue.key + ": " + issue.message;
    }
    return make_error(ErrorKind::invalid, why);
  }
  return std::get<RouterSection>(std::move(read));
}

std::string router_setting_text(const RouterSection& router, const std::string& key) {
  for (const auto& [name, v] : router_values(router)) {
    if (name == key) return v;
  }
  return "";
}

std::variant<Manifest, ManifestErrors> parse_manifest(std::string_view text,
                                                      const std::string& file) {
  Loader loader(file, manifest_dir(file));
  return loader.run(text);
}

std::variant<Manifest, ManifestErrors> load_manifest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::string why = std::strerror(errno);
    return ManifestErrors{{ManifestIssue{path, 0, 0, "file", "cannot open: " + why}}};
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_manifest(text.str(), path);
}

}  // namespace tandem::config
