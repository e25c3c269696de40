@0x8f6177db43de6f89;
# The frame every node-to-node message travels in. One Envelope = one fabric message.
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tandem::wire");

using Control = import "control.capnp";
using Serving = import "serving.capnp";
using Kv = import "kv.capnp";

# An actor's cluster-wide name: node/role/instance, e.g. "node-b/decode/decode-0".
# The node runtime itself is role "node", instance "".
struct ActorName {
  node @0 :Text;
  role @1 :Text;
  instance @2 :Text;
}

struct Envelope {
  protocolVersion @0 :UInt32;
  source @1 :ActorName;
  sourceAddress @2 :Text;      # "host:port" of the sending endpoint, so replies find it
  destination @3 :ActorName;
  correlationId @4 :UInt64;    # pairs a reply with its request; request ids for serving
  sourceIncarnation @5 :UInt64;

  # The message kind is the union's tag.
  body :union {
    hello @6 :Control.Hello;
    helloAck @7 :Control.HelloAck;
    heartbeat @8 :Control.Heartbeat;
    ping @9 :Control.Ping;
    pong @10 :Control.Pong;
    adminRequest @11 :Control.AdminRequest;
    adminReply @12 :Control.AdminReply;
    routeRequest @13 :Serving.RouteRequest;
    routeReply @14 :Serving.RouteReply;
    generateRequest @15 :Serving.GenerateRequest;
    prefillRequest @16 :Serving.PrefillRequest;
    prefillResult @17 :Serving.PrefillResult;
    tokenChunk @18 :Serving.TokenChunk;
    finish @19 :Serving.Finish;
    cancel @20 :Serving.Cancel;
    error @21 :Serving.Error;
    kvPullDone @22 :Kv.KvPullDone;
    kvEvents @23 :Kv.KvEvents;
    offloadStore @24 :Kv.OffloadStore;
    offloadStoreDone @25 :Kv.OffloadStoreDone;
    offloadLookup @26 :Kv.OffloadLookup;
    offloadLookupReply @27 :Kv.OffloadLookupReply;
    stepEvents @28 :Serving.StepEvents;
    kvResync @29 :Kv.KvResync;
  }
}
