// tandem/devices: writes a safetensors file (the HF weight format), for `tandem model synth`
// and tests.
//
// File layout: 8-byte little-endian header length N, then N bytes of JSON
//   {"__metadata__": {"format": "pt"}, "<name>": {"dtype": "F32"|"BF16"|"F16"|"F8_E4M3",
//    "shape": [..], "data_offsets": [begin, end]}, ...}
// padded with spaces so the data starts 8-byte aligned, then the tensors' bytes back to back
// in the order they were added (offsets are relative to the data start).
// Tensors are held in memory until write(): meant for small (synthetic, test) models.
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
  // Adds a tensor from f32 values, stored as `dtype` (f32, bf16 or f16).
  // Errors (invalid): empty or duplicate name, a zero dimension, values.size() != product of
  // shape, dtype f8_e4m3 (not supported for writing).
  Status add(const std::string& name, DType dtype, std::vector<uint64_t> shape,
             std::span<const float> values);
  // Writes the file (replacing it). Errors: failed (cannot open or write; names the path).
  Status write(const std::string& path) const;
  // The header JSON (without length prefix and padding), as written.
  std::string header_json() const;
  size_t tensor_count() const { return tensors_.size(); }

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    uint64_t begin_bytes, end_bytes;
  };
  std::vector<Tensor> tensors_;
  std::vector<std::byte> data_;
};

}  // namespace tandem::devices
