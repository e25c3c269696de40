// tandem/devices/rbln: the Device backend on the RBLN runtime (rbln_api.hpp) and a compiled
// model directory (rbln_artifact.hpp).
//
// - Prefill runs one sequence at a time through the prefill graph, in the artifact's chunk
//   size: input_ids and cache_position filled from the chunk's tokens and positions (padding:
//   token 0, position -1), the sequence's block table (padded with the dummy block) and the
//   query position (the chunk's last real token). The last chunk's logits row is the output.
// - Decode runs one token per sequence through the decode graph of the smallest bucket that
//   holds the step (a step larger than the largest bucket runs in several graph runs); padded
//   rows carry token 0 at position 0 with every block-table entry the dummy block, the one
//   block past the pool the executor allocates from, so they write only there.
// - Every run is submitted with rbln_async_run and waited for up to spec.rbln.run_timeout_ms.
//   A run that fails ends the pass with the library's message; a run that does not complete in
//   time ends it with timed_out and poisons the device (the runtime may still write the
//   buffers it was given): every later pass fails, naming that run, until the node restarts.
// - KV: the graphs take the cache as their last input (kv_cache), in Tandem's block layout
//   (device.hpp KvLayout, element_bytes from the artifact). kv_memory "host": the host pool that
//   kv_region() exposes for RMA. kv_memory "device" (spec.rbln.kv_on_device): a device buffer
//   from rbln_malloc, and the host pool is its staging copy: the bytes each pass writes are
//   copied device -> host after it (write-through, so RMA readers see current bytes); the
//   blocks a pass imports (PrefillSeq/DecodeSeq::imported) and its block copies' destinations
//   are copied host -> device before it; copy_blocks_out/in go through the device. A copy that
//   fails poisons the device like a run that never completes.
// - Pipelined prefill (the artifact's pipeline_parallel_size P > 1, rbln_artifact.hpp): one
//   graph per stage, opened on the instance's device S x tensor_parallel_size, each with a KV
//   buffer of its own layers (block-major, the pool's blocks and the dummy) on that device
//   (kv_memory "device") or in host memory. The host pool stays the whole model's, what RMA
//   readers see, and is the stages' staging copy: after each stage's run the rows it wrote go
//   stage -> host (slice_runs in kv_segments.hpp picks its layers' parts), imports and block
//   copies go host -> every stage before a pass. A pass's chunks go through the stages as a
//   wavefront: in wave t stage s runs chunk t - s, all of a wave's runs submitted before any
//   is waited for, so P stages are busy at once on a pass of P chunks or more. No decode graphs:
//   decode on such an executor is refused (the manifest refuses a decode instance on it).
// - Speculation: a decode step in which some sequence has drafts runs the verify graphs
//   (verify_batch_B, the artifact's verify_tokens T per row: a sequence's tokens at consecutive
//   positions in its row's first slots, the rest token 0 at position -1) and returns one logits
//   row per token; a sequence with more than T tokens, or drafts with no verify graphs, is
//   refused. A step without drafts runs the decode graphs.
// - Returns logits always (the runtime writes them to host memory; argmax_only is ignored, as
//   device.hpp allows).
#pragma once

#include <memory>

#include "devices/device.hpp"

namespace tandem::devices::rbln {

// Errors: failed (library or symbol missing, model or runtime creation failed, naming the path
// and the library's message), not_found / invalid (the artifact, or a mismatch with the
// manifest naming both values), invalid (blocks_total 0).
Result<std::unique_ptr<Device>> make_rbln_device(const DeviceSpec& spec);

// What `tandem check` probes for an rbln executor without touching a device: the compiled
// directory loaded and checked against the manifest, and the runtime library loaded with every
// symbol resolved (and with kv_memory "device", the device-memory calls). On success a one-line
// summary ("library L (9 symbols[, device-memory calls present][, KV in device memory]);
// compiled D: model M, compiler V, block B, max length L, chunk C, buckets [..] | pipeline
// stages P (layers ..), devices N");
// else the error the executor would start with.
Result<std::string> probe_rbln(const DeviceSpec& spec);

}  // namespace tandem::devices::rbln
