// The kv-offload actor shell (issue 13): a node's tier 2. Prefill instances offer computed
// blocks (OffloadStore) and ask for the blocks they lack (OffloadLookup); the blocks move by
// RMA between their pools and this actor's registered staging memory, and between staging
// and the node's NVMe through a kv::tier2::Tier2Store owned by a detached I/O actor (its
// calls block on the disk). Who owns each staging slot is decided by the pure
// kv_offload::OffloadCore.
//
// The store opens when the first message says what a block is (its KvLayout, carried by every
// OffloadStore descriptor and OffloadLookup): its fingerprint is the model name plus that
// layout, so another model, dtype or block size never matches. Messages that arrive while it
// opens wait (at most kv_offload.stores_max + lookups_max of them; beyond, an error answer).
// A failure of tier 2 is never a wrong answer: the asker computes what it did not get.
#pragma once

#include <caf/all.hpp>

#include "actors/common/shell.hpp"

namespace tandem::actors {

// The startup check of a node's tier 2 (kv_offload.enabled): its directory kv_offload.path /
// NODE exists or is created and is writable, and the filesystem has room for capacity_bytes
// (less what an existing data file already holds). invalid naming the key and the path.
Status check_tier2_directory(const config::Manifest& manifest, const std::string& node);

// Spawns the kv-offload shell for `instance` and registers it as NODE/kv-offload/NAME. Its
// directory is kv_offload.path / NODE (nodes of one machine do not share a store).
caf::actor spawn_kv_offload(caf::actor_system& system, const ShellContext& ctx,
                            const config::Instance& instance);

}  // namespace tandem::actors
