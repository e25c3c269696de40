// A cluster client: joins a running cluster over the fabric without being a member (the
// admin shell, benchmarks, tests). Blocking calls with timeouts; no actor system.
//
// Threads: methods may be called from one thread at a time (the caller's); replies are
// matched on the fabric progress thread by correlation id. At most `pending_max` replies are
// awaited at once; replies nobody waits for are dropped.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/manifest.hpp"
#include "messages/envelope.hpp"
#include "runtime/fabric/endpoint.hpp"

namespace tandem::runtime {

struct AdminAnswer {
  bool ok = false;
  std::string text;
  std::vector<std::vector<std::string>> rows;
  std::string answered_by;  // node name
};

class ClusterClient {
 public:
  static constexpr size_t pending_max = 4096;

  // bind_host: local address for the client's endpoint (ephemeral port). `manifest` outlives
  // the client. It connects with the cluster key, else the admin token (credentials.hpp);
  // `token_file` names an admin token to use instead.
  static Result<std::unique_ptr<ClusterClient>> connect(const config::Manifest& manifest,
                                                        const std::string& bind_host,
                                                        const std::string& token_file = "");
  ClusterClient(const config::Manifest& manifest, std::string name);  // use connect()
  ~ClusterClient();

  // Sends an admin command to NODE/node/ and waits for the reply.
  Result<AdminAnswer> admin(const std::string& node, const std::string& command,
                            const std::vector<std::string>& args,
                            std::chrono::milliseconds timeout);
  // Same, to the first node (manifest order) that answers within `timeout` each.
  Result<AdminAnswer> admin_any(const std::string& command, std::chrono::milliseconds timeout);

  // One round trip to any actor; returns the measured time.
  Result<std::chrono::nanoseconds> ping(const messages::ActorName& to,
                                        std::chrono::milliseconds timeout,
                                        size_t payload_bytes = 0);

  // Sends an arbitrary envelope (body filled by `fill`) and waits for the reply frame. A node
  // that has not answered after probe_after(timeout) is asked for a new session: when it
  // turns out to have restarted (its incarnation changed), the request, lost with its old
  // session, is sent again once; a slow node is not asked twice.
  Result<std::shared_ptr<messages::Frame>> call(
      const messages::ActorName& to, const std::function<void(wire::Envelope::Builder)>& fill,
      std::chrono::milliseconds timeout);

  // Sends bytes as one fabric frame to host:port, unvalidated (tests of malformed input).
  Status send_raw(const std::string& address, std::vector<std::byte> bytes);

  const std::string& name() const { return name_; }
  FabricEndpoint& fabric() { return *fabric_; }

 private:
  void on_frame(std::span<const std::byte> bytes, const PeerRef& from);
  static std::chrono::milliseconds probe_after(std::chrono::milliseconds timeout);
  Result<std::string> address_of(const std::string& node) const;

  const config::Manifest& manifest_;
  std::string name_;
  std::unique_ptr<FabricEndpoint> fabric_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_correlation_ = 1;
  std::map<uint64_t, std::shared_ptr<messages::Frame>> replies_;  // awaited ones only
  std::map<uint64_t, bool> awaited_;
};

// Picks a local address for a client of this manifest: the first node host that is a
// loopback address, else "" (the caller must be told to pass --bind).
std::string default_client_bind(const config::Manifest& manifest);

}  // namespace tandem::runtime
