// The conformance fake's model side: a `.rbln` graph file of a compiled model directory
// (devices/rbln/rbln_artifact.hpp) run by Tandem's cpu transformer, so `device = "rbln"` can be
// compared token for token with `device = "cpu"`.
//
// The directory's rbln_config.json carries, besides what the backend reads, "fake_model_path"
// (the weights: a llama2.c .bin or an HF directory; else "source_model_path", which
// `tandem model compile` writes) and optional fault switches:
//   "fake_fail_graph": "prefill" | "decoder_batch_N"  -- that graph's runs fail with a message
//   "fake_hang_graph": "..."                          -- that graph's runs never complete
//   "fake_hang_once_file": "PATH"                     -- with fake_hang_graph: only the run
//                                                        that creates PATH hangs (a fault a
//                                                        restart clears)
//   "fake_load_delay_ms": N                           -- opening the first graph takes N ms
//   "fake_run_delay_ms": N                            -- every run waits N ms (a pipeline
//                                                        stage: its share of the layers of
//                                                        it), then computes
// With "pipeline_parallel_size" P > 1 (and optional "pipeline_stage_layers"), the graphs
// DIR/prefill_stage_S.rbln run stage S's layers (devices/rbln/rbln_artifact.hpp): kv_cache holds
// only those layers, the first input of a later stage is the previous stage's hidden output.
// With "verify_tokens" T, the graphs DIR/verify_batch_N.rbln take T tokens per row (a row's
// slots at position -1 are padding) and return T logits rows per row.
// With "data_parallel_size" D > 1, the ranks' runs are collective, as the token exchange of an
// expert-parallel step makes them on the NPUs: the n-th run submitted on each of the D devices
// running the directory's graphs form round n, and no run of a round computes until all D have
// joined it (a rank left out waits for good: the caller's wait times out); the D runs of a round
// must be of the same graph, else each fails naming what every device ran. A (D+1)-th device
// running the directory's graphs in one process is refused (one data-parallel instance per
// directory and process). The fake still computes every expert on every rank.
// A graph run reads the blocks its block tables name from the kv_cache input into the cpu
// device's pool, computes the real rows (prefill: positions 0..query_position of the chunk;
// decode and verify: every row of the bucket, padded ones included), and writes the blocks it
// wrote back.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::rbln_fake {

class FakeGraph {
 public:
  virtual ~FakeGraph() = default;
  virtual int inputs() const = 0;
  virtual bool hangs() const = 0;
  // Called as a run is submitted on `device` (in submission order): its collective round, the
  // count of runs submitted on that device before it (data parallel; 0 otherwise).
  virtual uint64_t submit(int device) = 0;
  // "" on success, else the error message. `abandon` set (the runtime is being destroyed): a
  // run waiting for its round's other ranks gives up.
  virtual std::string run(const std::vector<void*>& inputs, void* logits, int device,
                          uint64_t round, const std::atomic<bool>& abandon) = 0;
};

// The graph at `path` (DIR/prefill.rbln, DIR/prefill_stage_S.rbln, DIR/decoder_batch_N.rbln or
// DIR/verify_batch_N.rbln). Null with `error` set
// when the directory's config or model cannot be loaded. Graphs of one directory share one
// model (weights loaded once per process).
std::shared_ptr<FakeGraph> open_fake_graph(const std::string& path, std::string& error);

}  // namespace tandem::rbln_fake
