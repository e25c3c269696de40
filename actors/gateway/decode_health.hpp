// Which decode instances can serve: the gateway's /health answer and its admission check.
// Pure (no clocks, threads or I/O): the gateway actor feeds it membership events and the
// instances' load reports and reads `healthy()` / `reason()` back.
//
// A decode instance counts as able to serve while (a) its node is this node or is up, and
// (b) its last load report said ready (its executor created the device and the pool is
// registered). An instance that has not reported yet is not ready (still starting).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace tandem::gateway {

class DecodeHealth {
 public:
  struct Instance {
    std::string node;
    std::string name;  // instance name, e.g. "decode"
  };
  // `self_node` is always up. `instances`: every decode instance of the manifest (may be
  // empty: then never healthy). Names must be unique per node (asserted).
  DecodeHealth(std::string self_node, const std::vector<Instance>& instances);

  // Membership: a node went up or down. Unknown nodes are ignored.
  void node_up(const std::string& node, bool up);
  // A node restarted: its instances must report ready again.
  void node_restarted(const std::string& node);
  // A load report of `actor_name` ("node/role/instance"); non-decode or unknown names are
  // ignored. `reason` (when !ready) is kept, cut to reason_bytes_max.
  void report(const std::string& actor_name, bool ready, const std::string& reason);

  bool healthy() const;
  // Why not healthy, for the 503 body: "no decode instance is ready: decode@node1 executor
  // failed: <why>; decode@node2 node is down". "" when healthy.
  std::string reason() const;
  // Whether the instance "node/decode/name" may be routed to (false if unknown).
  bool instance_ready(const std::string& actor_name) const;
  // How many decode instances can serve now (0 when !healthy()).
  uint32_t ready_count() const;

  static constexpr size_t reason_bytes_max = 512;

 private:
  struct View {
    std::string node;
    std::string name;
    bool reported = false;
    bool ready = false;
    std::string reason;
  };
  bool node_is_up(const std::string& node) const;
  bool can_serve(const View& v) const;

  std::string self_node_;
  std::map<std::string, bool> node_up_;      // node -> up (excludes self)
  std::map<std::string, View> instances_;    // "node/decode/name" -> view
};

}  // namespace tandem::gateway
