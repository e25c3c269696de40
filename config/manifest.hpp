// The cluster manifest: one TOML file describes the whole cluster.
//
// load_manifest() parses and validates in one pass and reports every problem it finds,
// each with file:line:column and the dotted key path. A Manifest that comes back is valid:
// later code never re-checks what is documented here. Reference: docs/manifest.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::config {

inline constexpr uint32_t protocol_version_current = 1;
inline constexpr uint32_t kWorkersMax = 256;  // [[node]] workers

enum class Role { gateway, router, prefill, decode, kv_offload, executor };
inline constexpr Role roles_all[] = {Role::gateway, Role::router,     Role::prefill,
                                     Role::decode,  Role::kv_offload, Role::executor};
std::string_view to_string(Role role);               // "gateway", ..., "kv-offload", "executor"
std::optional<Role> role_from_string(std::string_view text);

enum class DeviceKind { cpu, sim, rbln };
std::string_view to_string(DeviceKind kind);
std::optional<DeviceKind> device_kind_from_string(std::string_view text);

struct ClusterSection {
  std::string name;
  uint32_t protocol_version = protocol_version_current;
  // The cluster key (runtime/node/credentials.hpp): every node and client proves it holds it
  // when it connects, and every frame is sealed with keys derived from it. Absolute once
  // loaded. Empty: only on a manifest whose nodes are all on one host, which then uses a key
  // made beside the node's state (auto_key_path); on more than one host it is required.
  std::string key_file;
  // Keys also accepted from peers (never used to connect): the previous or the next key
  // while a new one is rolled out (docs/operations.md, "Rotating the cluster key").
  std::vector<std::string> accept_key_files;
};

// [admin]: the admin plane.
struct AdminSection {
  // A credential for operators that is not the cluster key: its holder may run admin
  // commands (tandem shell) but not act as a node. Absolute once loaded; "" = none.
  std::string token_file;
  // The admin HTTP endpoint's /metrics, /health, /status and /status.json ask for
  // `Authorization: Bearer <token>` (the token file's contents; token_file required).
  bool http_token_required = false;
};

struct FabricSection {
  std::string provider = "tcp;ofi_rxm";  // also "shm", "verbs;ofi_rxm"
  uint32_t send_queue_max = 1024;         // frames queued per peer before send() is refused
  uint32_t sends_inflight_max = 64;       // frames posted to the provider per peer at once
  uint32_t frame_bytes_max = 4u << 20;    // largest control frame, bytes
  uint32_t recv_buffers = 32;             // receive buffers posted, each frame_bytes_max
  uint32_t rma_chunk_bytes = 8u << 20;    // one RMA read op moves at most this many bytes
  uint32_t rma_inflight_max = 16;         // RMA read ops in flight per endpoint
  uint32_t connect_timeout_ms = 2000;     // hello must be answered within this
  uint32_t spin_us = 50;                  // progress thread busy-polls this long after activity
};

struct MembershipSection {
  uint32_t heartbeat_interval_ms = 200;
  uint32_t heartbeat_miss_max = 5;  // peer declared down after this many missed heartbeats
};

// What a node does when one of its executors' devices is lost for good (Device::lost(): a run
// that failed or never completed left the device unusable; only a new process reopens it).
//   restart-node: the node marks itself unhealthy, drains ([supervisor] drain_timeout_ms) and
//                 exits with status 75, for its supervisor (`tandem up`, systemd) to start it
//                 again, which reopens the device;
//   stay:         the instance stays not ready and the node keeps serving with what is left,
//                 until the operator restarts it.
enum class DeviceLostAction { restart_node, stay };
std::string_view to_string(DeviceLostAction action);  // "restart-node", "stay"

// The node's supervisor (runtime/node/supervisor.hpp): a serving actor that dies is
// restarted restart_delay_ms later, at most restarts_max times within restart_window_ms;
// beyond that it stays down (and /health says so) until the node restarts.
struct SupervisorSection {
  uint32_t restarts_max = 5;
  uint32_t restart_window_ms = 60'000;
  uint32_t restart_delay_ms = 500;
  // SIGTERM to a node: it stops taking new work (routers stop picking its prefill and decode
  // instances; its gateway answers new requests 503 shutting_down) and waits up to this long
  // for what it holds to end before it stops. 0: stop at once.
  uint32_t drain_timeout_ms = 30'000;
  // A prefill or decode instance's executor request (one device step) that takes longer ends
  // with an error for its requests; the instance reports itself not ready until the executor
  // answers again.
  uint32_t executor_step_timeout_ms = 60'000;
  // A prefill or decode instance waits this long for its executor to open its device (load the
  // model, or the compiled graphs); past it the instance reports itself not ready with that error.
  uint32_t executor_open_timeout_ms = 600'000;
  DeviceLostAction device_lost = DeviceLostAction::restart_node;
  // With restart_node: at most this many device-lost restarts of one node within the window
  // (kept across its processes, runtime/node/device_lost_record.hpp); the next loss keeps the
  // node up without the device, as "stay" does, instead of restarting it again.
  uint32_t device_lost_restarts_max = 3;
  uint32_t device_lost_window_ms = 3'600'000;
};

struct LoggingSection {
  std::string level = "info";  // trace, debug, info, warn, error
};

enum class ChatFormat { auto_detect, plain, chatml, minimax_m2 };
std::string_view to_string(ChatFormat format);  // "auto", "plain", "chatml", "minimax-m2"

struct ModelSection {
  std::string name;                   // served model id (what /v1/models lists first)
  // More ids the same model is served under (aliases, like vLLM's --served-model-name):
  // listed by /v1/models after `name`; a request for any of them is served and answered
  // under the id it asked for. Non-empty, distinct, none equal to `name`.
  std::vector<std::string> served_names;
  std::string path;                   // model file or directory; absolute once loaded
  uint32_t block_tokens = 16;         // KV block size, tokens
  // Prefix-cache match granularity, tokens (issue 13): a power of two dividing block_tokens.
  // Default: 512 (the reference design's) when block_tokens is larger, else block_tokens
  // (whole blocks). The gateway hashes every full sub-block; the device caches, the router
  // and `tandem sim` match them.
  uint32_t sub_block_tokens = 16;
  uint32_t max_model_tokens = 256;    // context length, tokens
  ChatFormat chat_format = ChatFormat::auto_detect;

  // `name`, then `served_names`: every id a request may ask for.
  std::vector<std::string> names() const;
  bool serves(std::string_view id) const;  // id is one of names()
};

// Sections that later work fills in. They exist now so that unknown sections stay errors.
enum class RouterPolicy { prefix_aware, round_robin, random };
std::string_view to_string(RouterPolicy policy);  // "prefix-aware", "round-robin", "random"
// How the router knows what each instance's device cache holds: `approximate` records its
// own picks (the blocks a picked instance will hold) and drops what instances report evicted;
// `precise` builds it only from the instances' numbered KV events (stored and removed), exact
// up to the events in flight, with a resync from a snapshot after a gap or restart.
enum class KvIndexMode { approximate, precise };
std::string_view to_string(KvIndexMode mode);  // "approximate", "precise"

struct RouterSection {
  RouterPolicy policy = RouterPolicy::prefix_aware;
  KvIndexMode kv_index = KvIndexMode::approximate;
  double weight_prefix = 1.0;       // [0, inf)
  double weight_queue = 1.0;
  double weight_kv_usage = 1.0;
  uint32_t prefix_index_blocks_max = 100000;  // per-instance LRU capacity, blocks
  uint32_t disaggregate_tokens_min = 256;     // uncached tokens at/above which P/D is used
  double load_imbalance_max = 0.5;  // bounded load: >= (1 + this) x mean load is not picked
  double prefill_load_imbalance_max = 1e6;  // the same for prefill instances (1e6: none)
  bool prefill_by_work = true;  // prefill instance by least estimated work in tokens
  double tier2_weight = 0.8;    // a tier-2 block on the prefill's node vs a device hit, [0, 1]
  double tier2_remote_weight = 0.5;  // one on another node (read over the fabric), <= tier2_weight
  uint32_t tier2_index_blocks_max = 262144;  // tier-2 blocks the router tracks per node
  uint32_t kv_resync_interval_ms = 2000;     // out of sync with a source: ask again after this
};

struct KvOffloadSection {
  bool enabled = false;
  std::string path;                 // directory for block files + RocksDB index (per node below)
  uint64_t capacity_bytes = 1ull << 30;  // the data file on each node's NVMe
  uint64_t host_cache_bytes = 0;
  uint32_t staging_blocks = 64;     // registered host memory blocks for RMA in and out
  uint32_t stores_max = 64;         // store offers in flight per kv-offload instance
  uint32_t lookups_max = 64;        // lookups in flight per kv-offload instance
  uint32_t lookup_blocks_max = 1024;  // blocks one lookup may bring back
  uint32_t hold_timeout_ms = 10000;   // pins on offered / staged blocks
  uint32_t lookup_timeout_ms = 2000;  // prefill waits this long for a lookup, then computes
  bool partial_blocks = true;  // with sub-blocks: prompts' trailing partial blocks too
};

enum class SpeculativeMethod { none, ngram, suffix, eagle3 };
std::string_view to_string(SpeculativeMethod method);  // "none", "ngram", "suffix", "eagle3"
// [speculative]: decode drafts with n-gram prompt lookup, suffix decoding or an EAGLE-3 draft
// head (draft_model, loaded beside each decode instance's executor; device cpu only). Each
// method's keys are refused under another method. Meanings: actors/decode/drafter.hpp,
// ngram_proposer.hpp, suffix_tree.hpp, devices/cpu/eagle3.hpp.
struct SpeculativeSection {
  SpeculativeMethod method = SpeculativeMethod::none;
  uint32_t draft_tokens_max = 4;   // 1..16
  uint32_t batch_max = 32;         // speculation off above this many running sequences
  double row_cost = 0.35;          // one more row's cost in one-row passes (drafter.hpp)
  // row_cost not in the manifest: a cpu or rbln decode executor measures it when it opens
  // (devices/pass_cost.hpp) and decode uses that; row_cost above is used until then, and on
  // the sim device. Given, it is used as given.
  bool row_cost_measured = true;
  uint32_t ngram_match_min = 2;    // n-gram: shortest suffix match
  uint32_t ngram_match_max = 8;    // n-gram: longest suffix match considered
  uint32_t ngram_candidates_max = 8;
  uint32_t suffix_depth_max = 24;
  double suffix_probability_min = 0.1;
  double suffix_match_factor = 1.0;
  uint32_t suffix_request_nodes_max = 1u << 17;
  uint32_t suffix_cache_nodes_max = 1u << 20;
  uint64_t suffix_cache_tokens_max = 1u << 18;
  std::string draft_model;  // eagle3: the head's HF directory (absolute after loading)
};

// [gateway]: the HTTP API's limits and keys.
struct GatewaySection {
  std::vector<std::string> api_keys;     // empty = no authentication
  uint64_t body_bytes_max = 16u << 20;   // larger request bodies get 413
  uint32_t connections_max = 4096;       // open HTTP connections
  uint32_t requests_max = 1024;          // requests in flight (admitted) across the gateway
  uint32_t queue_max = 4096;             // requests waiting for admission; beyond: 429
  uint32_t request_timeout_ms = 600000;  // a request that produced nothing for this long fails
  uint32_t queue_timeout_ms = 30000;     // a request waiting for admission this long gets 503
  // Slow clients: a request's head must arrive within header_timeout_ms (from its first byte;
  // the first request of a connection from the accept), its body within body_timeout_ms of
  // the head's end; else 408 and close.
  uint32_t header_timeout_ms = 15000;
  uint32_t body_timeout_ms = 60000;
  uint32_t connections_per_client_max = 256;  // open HTTP connections per peer IP
  std::string cache_secret;              // block-hash key; "" = derived from the cluster name
  // With api_keys: prefix-cache blocks are salted per key, so one tenant cannot see through
  // cached_tokens or timing whether another sent a prompt; true shares them across keys.
  bool share_prefix_cache_across_keys = false;
  // Host header values the API answers besides the node's own names and addresses
  // (DNS-rebinding defence): e.g. a load balancer's name. "*" accepts any.
  std::vector<std::string> allowed_hosts;
  // Origins a browser page may call the API from (CORS); empty: no cross-origin access.
  std::vector<std::string> cors_origins;
  // Actors that parse, tokenize and hash requests in parallel on the node's workers; 0 =
  // the node's workers, clamped to 2..16 (gateway_preparers()).
  uint32_t preparers = 0;
  // Requests with bodies over long_prompt_bytes are prepared by long_prompt_preparers
  // actors with threads of their own instead: tokenizing a long prompt takes tens of ms, and
  // on the workers it would hold one (actors are not preempted) from streaming meanwhile.
  uint32_t long_prompt_preparers = 2;
  uint64_t long_prompt_bytes = 65536;
};


// [prefill]: the prefill scheduler of every prefill instance.
struct PrefillSection {
  uint32_t queue_max = 256;
  uint32_t running_max = 16;
  uint32_t held_max = 256;
  uint32_t step_tokens_max = 512;
  uint32_t hold_timeout_ms = 30000;   // blocks held for decode to pull, after completion
};

// [decode]: the decode scheduler of every decode instance.
struct DecodeSection {
  uint32_t waiting_max = 256;
  uint32_t seqs_max = 64;
  uint32_t step_tokens_max = 512;
  uint32_t prefill_timeout_ms = 30000;  // remote prefill answer; then prefill locally
};

// [sim]: parameters of the sim device (devices/sim; docs/sim-device.md), name -> number.
// Unknown names are reported when an executor creates its device.
struct SimSection {
  std::vector<std::pair<std::string, double>> params;
};

// [rbln]: the RBLN runtime and the compiled model that executors with device = "rbln" use
// (devices/rbln/; docs/rbln.md). Required (artifacts) when any executor has device "rbln".
struct RblnSection {
  std::string library = "/usr/local/lib/librbln_runtime.so";  // the SDK's default
  std::string artifacts;  // compiled model directory; absolute once loaded
  // Or the compile cache (devices/rbln/rbln_compile.hpp): `tandem model compile` runs
  // `compiler` into `cache_dir` (default DIR/rbln-cache beside the manifest); executors use it.
  std::string compiler;
  std::string cache_dir;
  // A compiled directory for the executors of prefill instances only (e.g. a pipelined prefill,
  // pipeline_parallel_size in its rbln_config.json); absolute once loaded. Empty: they use
  // artifacts or the compile cache like the others.
  std::string prefill_artifacts;
  // What the compile cache compiles (with `compiler`): the executors of prefill instances as a
  // pipeline of this many stages (prefill_stage_S.rbln, devices = stages x tensor parallel),
  // optionally with the layers of each stage; the executors of decode instances as this many
  // data-parallel ranks (devices = ranks x tensor parallel). 1: one graph set on all devices.
  uint32_t prefill_pipeline_stages = 1;
  std::vector<uint32_t> prefill_stage_layers;  // empty: an equal split
  uint32_t decode_data_parallel = 1;
  uint32_t prefill_chunk = 128;   // a multiple of 64
  uint32_t kv_element_bytes = 2;  // 1, 2 or 4
  // kv_memory: "host" (false): the graphs take the host pool as their KV cache; "device"
  // (true): a device buffer (rbln_malloc), staged to and from the host pool by rbln_memcpy.
  bool kv_on_device = false;
  uint32_t line = 0;              // of the [rbln] table; 0 when absent
};

struct Instance {
  Role role = Role::gateway;
  std::string name;                  // unique in the cluster (after count expansion)
  // executor only
  DeviceKind device = DeviceKind::cpu;
  std::vector<uint32_t> device_ids;  // device indices on the node (this instance's slice)
  uint32_t kv_blocks = 512;          // KV pool size, blocks of model.block_tokens (1..1<<24)
  uint32_t threads = 0;              // cpu device compute threads; 0 = all cores
  // device "sim" only: this executor's values of [sim] keys (e.g. decode DP+EP while prefill
  // runs PP: sim = { dp_ep = 1 }); the rest come from [sim]. Manifest::sim_params merges.
  std::vector<std::pair<std::string, double>> sim;
  // prefill and decode only: the executor instance (same node) that runs its batches;
  // already expanded (`exec-1`) and checked to exist, be an executor, and serve only this
  std::string executor;
  uint32_t line = 0;                 // manifest line of the [[node.instance]] table
};

struct Node {
  std::string name;
  std::string host;          // where peers and clients reach the node
  // Listen addresses per plane, filled at load: api_host and fabric_host default to host;
  // admin_host to host when host is a loopback address, else 127.0.0.1 (the admin plane stays
  // on the machine unless the manifest says otherwise).
  std::string api_host, fabric_host, admin_host;
  uint16_t fabric_port = 0;
  std::optional<uint16_t> admin_port;  // /metrics and health, HTTP
  std::optional<uint16_t> http_port;   // the OpenAI-compatible API (gateway nodes)
  // The node's actor worker threads (CAF scheduler); absent: default_workers().
  std::optional<uint32_t> workers;
  uint32_t workers_count() const;  // workers, else default_workers()
  std::vector<Instance> instances;      // count already expanded
  uint32_t line = 0;
};

// Actor worker threads of a node without `workers`: half the machine's hardware threads,
// clamped to 2..16 (the node's other threads -- HTTP, fabric progress, blocking executors --
// and its neighbours keep the rest; idle workers wake every 1 ms to look for work to steal,
// so a large default would cost idle CPU). `workers` goes up to kWorkersMax.
uint32_t default_workers();

// The preparers a gateway on `node` runs: [gateway] preparers, else its node's workers
// clamped to 2..16.
uint32_t gateway_preparers(const GatewaySection& gateway, const Node& node);

struct Manifest {
  std::string file;  // path it was loaded from
  std::string dir;   // its directory, absolute (relative paths resolve against it)
  ClusterSection cluster;
  AdminSection admin;
  FabricSection fabric;
  MembershipSection membership;
  SupervisorSection supervisor;
  LoggingSection logging;
  ModelSection model;
  RouterSection router;
  KvOffloadSection kv_offload;
  SpeculativeSection speculative;
  GatewaySection gateway;
  PrefillSection prefill;
  DecodeSection decode;
  SimSection sim;
  RblnSection rbln;
  std::vector<Node> nodes;

  const Node* find_node(std::string_view name) const;        // nullptr if absent
  // Every node's host is a loopback address, or all are the same host.
  bool single_host() const;
  // Every instance of a role across the cluster, with its node.
  std::vector<std::pair<const Node*, const Instance*>> instances_of(Role role) const;
  // The executor instance named `name` (nullptr if absent or not an executor).
  const Instance* find_executor(std::string_view name) const;
  // The sim parameters of an executor: [sim], then the executor's own `sim` values.
  std::map<std::string, double> sim_params(const Instance& executor) const;
};

struct ManifestIssue {
  std::string file;
  uint32_t line = 0;    // 1-based; 0 when the problem has no single place (e.g. "no gateway")
  uint32_t column = 0;  // 1-based; 0 when unknown
  std::string key;      // dotted key path, e.g. "node[1].instance[0].role"
  std::string message;
  std::string describe() const;  // "file:line:column: key: message"
};

struct ManifestErrors {
  std::vector<ManifestIssue> issues;  // never empty
  std::string describe() const;       // one issue per line
};

// Parses and validates the file. Never throws for bad input: an unreadable file, a TOML
// syntax error (reported alone) or any number of validation problems come back as
// ManifestErrors, issues sorted in file order (placeless ones, line 0, last).
std::variant<Manifest, ManifestErrors> load_manifest(const std::string& path);
// Same, from text (file is used only in messages).
std::variant<Manifest, ManifestErrors> parse_manifest(std::string_view text,
                                                      const std::string& file);

// Live router settings (`tandem shell` router show / router set): the [router] keys a running
// router may change, with their values as TOML text, in manifest order.
std::vector<std::pair<std::string, std::string>> router_settings(const RouterSection& router);
// `current` with `key` set to `value` (TOML text; a bare word is taken as a string), checked by
// the manifest's own [router] rules against the other current values. Error (invalid): an
// unknown key (naming the settable ones), a key fixed at start (naming it), or the rule's
// message with the key ("router.weight_queue: must be in [0, 1000000], got -1").
Result<RouterSection> set_router_key(const RouterSection& current, const std::string& key,
                                     const std::string& value);
// A key's value as TOML text ("" for an unknown key).
std::string router_setting_text(const RouterSection& router, const std::string& key);

// host is 127.0.0.0/8, ::1 or localhost.
bool is_loopback_host(std::string_view host);
// An IPv4 or IPv6 literal, or a host name (RFC 1123 labels).
bool valid_host(std::string_view host);
// A listen address that takes every interface (0.0.0.0, ::, [::]).
bool is_wildcard_host(std::string_view host);

// One-screen human summary (model, router, gateway limits, nodes, their addresses,
// instances). Never prints API keys or the cache secret.
std::string summarize(const Manifest& manifest);

}  // namespace tandem::config
