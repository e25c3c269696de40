// tandem/devices: do a node's KV pools fit in its host's memory?
//
// A sim pool is mmap'd lazily (MAP_NORESERVE): an oversized one starts fine and the kernel
// kills the node later, under load, when the pool is written -- silently for the clients.
// So the node checks at startup (tools/cmd_node.cpp, and `tandem check` for the nodes on this
// host) that the pools it will create fit, and refuses to start otherwise; `tandem up` checks
// the pools of all the nodes it starts on this host together.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "devices/device.hpp"
#include "runtime/base/result.hpp"

namespace tandem::devices {

// Host bytes the KV pool of a device built from `spec` takes once written: sim:
// blocks_total x its block bytes (rows of kv_bytes_per_token x kv_scale); cpu: blocks_total x
// block_tokens x layers x 2 x kv_heads x head_dim x 4 (fp32), the shape read from the model's
// config.json or llama2.c header (no tensor is read); rbln: 0 (device memory).
// Errors: invalid (bad sim parameters, a bad model header), not_found (no model file).
// Reads at most one small file: call at startup.
Result<uint64_t> kv_pool_host_bytes(const DeviceSpec& spec);

// This machine's physical memory (sysconf), bytes; 0 when unknown.
uint64_t host_memory_bytes();

// The memory the KV pools of one node may take: memory minus a margin of max(10%, 1 GiB)
// for the rest of the process (weights, buffers, the tokenizer) and the system.
uint64_t kv_pool_budget_bytes(uint64_t memory_bytes);

// One use of a node's memory: an executor's KV pool, or (`what` set) another buffer the node
// allocates at start (the fabric's receive buffers, tier 2's host cache and staging).
struct KvPoolUse {
  std::string executor;  // instance name
  uint64_t bytes = 0;
  uint32_t kv_blocks = 0;
  uint32_t block_tokens = 0;
  std::string what;  // not a KV pool: what it is and the keys that size it
};

// nullopt when the pools fit kv_pool_budget_bytes(memory_bytes) (or memory is unknown, 0).
// Else the startup error: each pool's bytes, the total, the memory and budget, and the
// manifest keys that shrink a pool. Pure.
// `who` names the pools' owner in the message ("node 'a'", "this host's nodes a, b").
std::optional<std::string> check_kv_pools_fit(const std::string& who,
                                              std::span<const KvPoolUse> pools,
                                              uint64_t memory_bytes);

// "1.6 GB (1600000000 bytes)"-style text for messages.
std::string describe_bytes(uint64_t bytes);

}  // namespace tandem::devices
