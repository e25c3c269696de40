@0xc244da0d5b691d1e;
# Control plane: membership, heartbeats, the admin shell. Every message here travels inside
# an Envelope (envelope.capnp).
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tandem::wire");

# A node or client announcing itself. Sent by a node to every peer at start and whenever a
# peer is seen again after being down; by the admin shell to the node it talks to.
# Answered by HelloAck. A receiver whose protocol version differs refuses the peer (it logs
# both versions and answers HelloAck with accepted = false).
struct Hello {
  protocolVersion @0 :UInt32;
  nodeName @1 :Text;
  clusterName @2 :Text;
  fabricAddress @3 :Text;      # "host:port" the sender's endpoint listens on
  incarnation @4 :UInt64;      # random per process start; a new value means "restarted"
  isClient @5 :Bool;           # admin shell or load generator: not a cluster member
  startedUnixMs @6 :UInt64;
}

struct HelloAck {
  accepted @0 :Bool;
  protocolVersion @1 :UInt32;  # the answering node's version
  nodeName @2 :Text;
  incarnation @3 :UInt64;
  reason @4 :Text;             # why not accepted
}

# Load of one serving instance, carried in heartbeats. The router reads it.
struct InstanceLoad {
  instance @0 :Text;           # "prefill-0"
  role @1 :Text;               # "prefill" | "decode"
  requestsWaiting @2 :UInt32;
  requestsRunning @3 :UInt32;
  kvBlocksUsed @4 :UInt32;
  kvBlocksTotal @5 :UInt32;
  ready @6 :Bool = true;       # the instance can serve (its executor created the device)
  notReadyReason @7 :Text;     # why not, when ready is false ("executor failed: ...")
  # Prefill: its tier-2 cost rule reads (rather than computes) from its node's kv-offload /
  # another node's; the router credits tier-2 copies only where they would be read.
  tier2LocalReads @8 :Bool = true;
  tier2RemoteReads @9 :Bool = true;
  # Prefill: prompt tokens it still has to compute (queued + running), when reported.
  pendingTokens @10 :UInt64;
  pendingTokensKnown @11 :Bool = false;
  # Blocks on the free list (neither referenced nor cached), when reported.
  kvBlocksFree @12 :UInt32;
  kvBlocksFreeKnown @13 :Bool = false;
  # The instance's node is draining it (`tandem shell` drain, SIGTERM): routers stop picking
  # it; what it holds runs to its end.
  draining @14 :Bool = false;
}

# Sent by every node to every peer node each heartbeat interval. Not answered; a peer that
# misses heartbeatMissMax intervals is declared down.
struct Heartbeat {
  incarnation @0 :UInt64;
  sequence @1 :UInt64;         # increases by one per heartbeat of this incarnation
  sentUnixNs @2 :UInt64;
  uptimeMs @3 :UInt64;
  load @4 :List(InstanceLoad);
}

# Round trip probe. Pong echoes the nonce; the sender times it.
struct Ping {
  nonce @0 :UInt64;
  sentMonoNs @1 :UInt64;       # sender's monotonic clock; meaningful to the sender only
  payload @2 :Data;            # optional, for bandwidth probes
}

struct Pong {
  nonce @0 :UInt64;
  sentMonoNs @1 :UInt64;       # copied from Ping
}

# The admin shell asks a node something. Answered by AdminReply with the same
# correlation id. Commands are words so new ones need no schema change.
struct AdminRequest {
  command @0 :Text;            # "nodes" | "actors" | "stats" | "ping" | ...
  args @1 :List(Text);
}

struct AdminReply {
  ok @0 :Bool;
  text @1 :Text;               # human-readable answer (tables), or the error
  rows @2 :List(List(Text));   # the same answer as rows, for scripts; first row = header
}
