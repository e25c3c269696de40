// tandem/devices: writes a safetensors file (the HF weight format), for `tandem model synth`
// and tests.
//
// File layout: 8-byte little-endian header length N, then N bytes of JSON
//   {"__metadata__": {"format": "pt"}, "<name>": {"dtype": "F32"|"BF16"|"F16"|"F8_E4M3",
//    "shape": [..], "data_offsets": [begin, end]}, ...}
// padded with spaces so the data starts 8-byte aligned, then the tensors' bytes back to back
// in the order they were added (offsets are relative to the data start).
// Tensors are held in memory until write(): meant for small (synthetic, test) models.
//
// Sharded checkpoints (write_checkpoint with shard_count N > 1), as HF transformers saves
// them: model-00001-of-0000N.safetensors ... model-0000N-of-0000N.safetensors, each a
// safetensors file holding a contiguous run of the tensors (in the order added, sizes
// balanced by bytes, every shard non-empty), plus model.safetensors.index.json:
//   {"metadata": {"total_size": <sum of tensor data bytes>},
//    "weight_map": {"<tensor>": "<shard file>", ...}}   (keys sorted, indent 2)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "devices/device.hpp"
#include "runtime/base/result.hpp"

namespace tandem::devices {

std::string_view safetensors_dtype_name(DType dtype);  // "F32", "BF16", "F16", "F8_E4M3"
uint16_t f32_to_bf16(float value);  // round to nearest even; NaN stays NaN
uint16_t f32_to_f16(float value);   // IEEE half, round to nearest even, overflow -> inf

class SafetensorsWriter {
 public:
  static constexpr uint32_t kShardCountMax = 99999;  // five-digit shard file names
  // Adds a tensor from f32 values, stored as `dtype` (f32, bf16 or f16).
  // Errors (invalid): empty or duplicate name, a zero dimension, values.size() != product of
  // shape, dtype f8_e4m3 (not supported for writing).
  Status add(const std::string& name, DType dtype, std::vector<uint64_t> shape,
             std::span<const float> values);
  // Adds an I64 tensor (e.g. an EAGLE-3 head's d2t table). Errors as add().
  Status add_i64(const std::string& name, std::vector<uint64_t> shape,
                 std::span<const int64_t> values);
  // Writes the file (replacing it). Errors: failed (cannot open or write; names the path).
  Status write(const std::string& path) const;
  // Writes a checkpoint into the existing directory `dir`: shard_count 1 -> model.safetensors;
  // N > 1 -> N shards + model.safetensors.index.json (see above). Removes files a previous
  // write with another shard count left there (model.safetensors, its index,
  // model-NNNNN-of-NNNNN.safetensors), so the directory holds exactly one checkpoint.
  // Errors: invalid (shard_count 0, above 99999 or above tensor_count()), failed (as write).
  Status write_checkpoint(const std::string& dir, uint32_t shard_count) const;
  // The first tensor index of each shard (size shard_count, starts at 0, strictly increasing).
  // Precondition (asserted): 1 <= shard_count <= tensor_count().
  std::vector<size_t> shard_starts(uint32_t shard_count) const;
  // "model-0000i-of-0000N.safetensors" for shard i in [1, N].
  static std::string shard_file_name(uint32_t shard_number, uint32_t shard_count);
  // The header JSON (without length prefix and padding), as written.
  std::string header_json() const;
  size_t tensor_count() const { return tensors_.size(); }

 private:
  struct Tensor {
    std::string name;
    std::string dtype_name;  // "F32", "BF16", "F16", "I64"
    std::vector<uint64_t> shape;
    uint64_t begin_bytes, end_bytes;
  };
  std::string header_json(size_t first, size_t last) const;  // tensors [first, last)
  // Checks name and shape (invalid naming the tensor); the element count on success.
  Result<uint64_t> check_new(const std::string& name, const std::vector<uint64_t>& shape,
                             uint64_t values_count) const;
  Status write_range(const std::string& path, size_t first, size_t last) const;
  std::vector<Tensor> tensors_;
  std::vector<std::byte> data_;
};

}  // namespace tandem::devices
