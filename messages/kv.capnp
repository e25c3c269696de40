@0xaa15136ca58f158b;
# KV plane: where blocks live, moving them by RMA, and the events that keep the router's
# and tier 2's views current.
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tandem::wire");

# A registered memory region a peer may read with one-sided RMA.
struct RemoteRegion {
  fabricAddress @0 :Text;     # "host:port" of the endpoint that registered it
  baseAddress @1 :UInt64;     # what RMA addresses are relative to (0 for offset addressing)
  lengthBytes @2 :UInt64;
  key @3 :UInt64;             # memory key (fi_mr_key)
}

# How a KV block is laid out, so the reader can check it matches its own pool.
struct KvLayout {
  blockTokens @0 :UInt32;
  layers @1 :UInt32;
  kvHeads @2 :UInt32;
  headDim @3 :UInt32;
  elementBytes @4 :UInt32;
  blockBytes @5 :UInt64;
  order @6 :UInt32;           # devices::KvOrder: 0 block-major, 1 layer-major
  inner @7 :UInt32;           # devices::KvInner: 0 [slot][head][dim], 1 [head][slot][dim]
  layerFirst @8 :UInt32;      # the pool holds model layers [layerFirst, layerFirst + layers)
}

# `parts` consecutive (layer, K|V) parts of one block (layer 0 K, layer 0 V, layer 1 K, ...)
# from (layer, part), contiguous at offsetBytes of the descriptor's region.
struct KvSegment {
  layer @0 :UInt32;           # a model layer
  part @1 :UInt32;            # 0 K, 1 V
  parts @2 :UInt32;
  offsetBytes @3 :UInt64;
}

# One KV block in a peer's registered pool.
struct BlockDescriptor {
  region @0 :RemoteRegion;
  offsetBytes @1 :UInt64;     # from the region's base
  lengthBytes @2 :UInt64;
  blockHash @3 :Data;         # the chained hash of the tokens it holds
  layout @4 :KvLayout;
  # Where the block's parts are (devices/kv_segments.hpp); a reader plans its reads from them
  # and refuses a block whose parts it cannot place. Empty: one block-major run at offsetBytes.
  segments @5 :List(KvSegment);
}

# Decode -> prefill: the blocks of requestId have been pulled (or abandoned); unpin them.
struct KvPullDone {
  requestId @0 :UInt64;
  ok @1 :Bool;
}

# Prefill/decode/kv-offload -> router: blocks entered or left an instance's cache (tier 1)
# or a node's tier 2 (kv-offload). Precise: numbered frames, see actors/router/kv_sequence.hpp;
# a frame's `removed` applies before its `stored`, and `stored` is in chain order.
struct KvEvents {
  instance @0 :Text;
  stored @1 :List(Data);      # block hashes
  removed @2 :List(Data);
  allCleared @3 :Bool;        # the source's view starts over (a snapshot's first frame)
  tier @4 :UInt8;             # 0 or 1: a device cache; 2: tier 2
  sequence @5 :UInt64;        # 1, 2, 3, ... per source incarnation (the envelope's)
  # Tier 1: stored[i]'s parent hash (the previous block of its chain), parallel to stored;
  # an empty Data: the first block of a chain.
  storedParents @6 :List(Data);
}

# Router -> kv-offload, prefill or decode: the router lost track of this source's events (a
# gap, a restart, or it never heard them): send a snapshot (allCleared, then what the source
# holds, numbered).
struct KvResync {
  reason @0 :Text;
}

# Prefill -> kv-offload: keep these blocks in tier 2. The offload instance pulls the bytes
# by RMA from the given descriptors and answers OffloadStoreDone.
struct OffloadStore {
  requestId @0 :UInt64;
  blocks @1 :List(BlockDescriptor);
}

struct OffloadStoreDone {
  requestId @0 :UInt64;
  storedBlocks @1 :UInt32;
}

# Prefill -> kv-offload: which of these (chained) hashes do you have? Answered by
# OffloadLookupReply with the longest stored prefix, staged in kv-offload's registered
# memory, and descriptors to read them; the asker answers KvPullDone when it read them.
struct OffloadLookup {
  requestId @0 :UInt64;
  blockHashes @1 :List(Data);
  layout @2 :KvLayout;        # of the asker's pool: another layout never matches
  # What computing the asked blocks would cost the asker; kv-offload stages only the blocks
  # its disk reads within it, behind its queue (0: no budget).
  budgetNs @3 :UInt64;
  # Sub-blocks (sub_block_tokens below block_tokens): the prompt's prefix hashes of the asked
  # positions, subBlocks per position (the last may have fewer: the prompt's trailing partial
  # block); every subBlocks-th is blockHashes[i]. Where the whole blocks stop, kv-offload
  # stages the longest partial block of that position it holds (its hash: the prefix hash of
  # its last sub-block). Empty: whole blocks only.
  subBlockHashes @4 :List(Data);
  subBlocks @5 :UInt32;
  # Sub-blocks of the first asked position the asker already holds: a partial block there is
  # staged only if longer (a shorter one would be read for nothing).
  subBlocksHeld @6 :UInt32;
  # And it must add at least this many sub-blocks past them (its read costs a whole block's;
  # prefill's tier2_partial_gain_min). 0: 1.
  partialGainMin @7 :UInt32;
}

struct OffloadLookupReply {
  requestId @0 :UInt64;
  blocks @1 :List(BlockDescriptor);   # the stored prefix, in order
  # kv-offload's measured disk read rate (0: not measured yet). A read is never faster than
  # the disk: prefill's cost rule takes it before its own first read of this source, so a
  # slow disk is known from the first answer, even one that staged nothing.
  diskBytesPerS @2 :Float64;
}
