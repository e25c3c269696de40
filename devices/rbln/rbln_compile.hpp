// The rbln compile cache: `tandem model compile` runs the operator's compiler for every graph an
// rbln executor needs, into a cache directory keyed by what the graphs depend on; a node then
// uses what it finds there and refuses what another compiler version built.
//
// The compiler is the manifest's `[rbln] compiler`, a command line run by /bin/sh, called as
//   COMPILER --version                       first line of stdout: the version
//   COMPILER --model PATH --out DIR --block-tokens B --max-seq-len L --prefill-chunk C
//            --buckets N1,N2,... --devices D --kv-blocks K --kv-element-bytes E
//            [--data-parallel R] [--verify-tokens T]
// once per executor, writing DIR/prefill.rbln and DIR/decoder_batch_N.rbln for every bucket
// and exiting 0: the graphs of one model are compiled together (as optimum-rbln does) because
// they share one KV cache on the device. With --verify-tokens T (the executor's decode instance
// speculates: T = [speculative] draft_tokens_max + 1) it also writes DIR/verify_batch_N.rbln
// for every bucket (rbln_artifact.hpp has their inputs). With --data-parallel R (R > 1, [rbln]
// decode_data_parallel) the graph set is one rank's, on D devices; the node opens it once per
// rank. A pipelined prefill ([rbln] prefill_pipeline_stages P > 1) is called instead as
//   COMPILER --model PATH --out DIR --block-tokens B --max-seq-len L --prefill-chunk C
//            --pipeline-stages P --stage-layers L0,L1,... --devices D --kv-blocks K
//            --kv-element-bytes E
// writing DIR/prefill_stage_S.rbln for S = 0..P-1 (stage S: layers L0+..+L(S-1) onward, on D
// devices; rbln_artifact.hpp has their inputs) and no decode graph.
// tools/rbln-compile wraps optimum-rbln this way (it refuses --pipeline-stages: optimum-rbln
// publishes no stage export). Tandem writes rbln_config.json itself (rbln_artifact.hpp) from
// the model's shape.
//
// Cache layout: CACHE/<model name>-<16 hex digits of the shape key>/<compiler version>/, the
// shape key hashing the model's fingerprint (config or header, file sizes), block size, max
// length, chunk, buckets, device count, stages and their layers, ranks, KV blocks and element
// bytes, and verify tokens when there are verify graphs. The public stack's own
// cache leaves the compiler version out; here an entry built by another version is found (its
// shape directory exists) and refused, naming both versions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "devices/device.hpp"
#include "runtime/base/result.hpp"

namespace tandem::devices::rbln {

// What one executor's graphs are compiled for.
struct CompileRequest {
  std::string model_path;
  std::string model_name;
  uint32_t block_tokens = 0;
  uint32_t max_seq_len = 0;
  uint32_t prefill_chunk = 128;
  std::vector<uint32_t> buckets;       // ascending; empty for a pipelined prefill
  uint32_t devices = 1;                // tensor parallel: devices per stage or rank
  uint32_t stages = 1;                 // pipeline stages (a prefill-only executor)
  std::vector<uint32_t> stage_layers;  // per stage; empty: an equal split of the model's
  uint32_t ranks = 1;                  // data-parallel ranks
  uint32_t verify_tokens = 0;          // > 0: verify graphs of this many tokens per sequence
  uint32_t kv_blocks = 0;  // the directory's kvcache_num_blocks (executor's + 1 dummy)
  uint32_t kv_element_bytes = 2;
};

// The request for an rbln executor's DeviceSpec (spec.rbln.compiler set): buckets are the powers
// of two below [decode] seqs_max, then seqs_max (1, 2, 4, 8 for 8; 1 alone when the executor
// serves no decode instance; none for a pipelined prefill). The executor's devices split into
// spec.rbln.pipeline_stages or data_parallel parts of `devices` each. verify_tokens is
// spec.rbln.draft_tokens_max + 1 when that is set.
CompileRequest compile_request(const DeviceSpec& spec);

// The layers of each pipeline stage for a model of `layers` layers: request.stage_layers, or an
// equal split. invalid naming [rbln] prefill_stage_layers or prefill_pipeline_stages when they
// do not fit the model.
Result<std::vector<uint32_t>> stage_layers_for(const CompileRequest& request, uint32_t layers);

// The compiler's version (`COMPILER --version`, first line, trimmed). failed when it cannot run,
// exits non-zero or prints nothing.
Result<std::string> compiler_version(const std::string& compiler);

// The cached directory for `request` built by `version`: CACHE/.../<version>. not_found when
// none; when the shape was compiled by other versions only, the error names them and `version`.
Result<std::string> find_cached(const CompileRequest& request, const std::string& cache_dir,
                                const std::string& version);

struct CompileOutcome {
  std::string dir;
  bool cached = false;  // found, nothing compiled
  uint32_t graphs = 0;  // compiled now
};

// find_cached, else runs the compiler into a temporary directory beside the entry, checks every
// graph is there, writes rbln_config.json, and renames it into place. Errors: failed, with the
// command's exit status or the missing graph, and its output's last line.
Result<CompileOutcome> compile(const CompileRequest& request, const std::string& compiler,
                               const std::string& cache_dir);

}  // namespace tandem::devices::rbln
