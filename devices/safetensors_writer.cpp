#include "devices/safetensors_writer.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tandem::devices {

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::f8_e4m3: return "F8_E4M3";
  }
  return "?";
}

uint16_t f32_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

uint16_t f32_to_f16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t abs_bits = bits & 0x7fffffff;
  if (abs_bits > 0x7f800000) return sign | 0x7e00;  // NaN
  if (abs_bits >= 0x477ff000) return sign | 0x7c00;  // rounds to >= 65536: inf
  if (abs_bits < 0x38800000) {                       // below the smallest normal half
    // Subnormal: value / 2^-24, rounded to nearest even.
    float scaled = std::fabs(value) * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t mantissa = abs_bits & 0x7fffff;
  uint32_t exponent = (abs_bits >> 23) - 127 + 15;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // carries into the exponent
  return sign | static_cast<uint16_t>(half);
}

Status SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<uint64_t> shape,
                              std::span<const float> values) {
  auto invalid = [&name](const std::string& why) {
    return make_error(ErrorKind::invalid, "safetensors: tensor '" + name + "': " + why);
  };
  if (name.empty() || name == "__metadata__") return invalid("bad name");
  for (const Tensor& t : tensors_) {
    if (t.name == name) return invalid("added twice");
  }
  uint64_t elems = 1;
  for (uint64_t d : shape) {
    if (d == 0) return invalid("a dimension is 0");
    elems *= d;
  }
  if (elems != values.size()) {
    return invalid("shape holds " + std::to_string(elems) + " elements, " +
                   std::to_string(values.size()) + " given");
  }
  if (dtype == DType::f8_e4m3) return invalid("F8_E4M3 is not supported for writing");
  uint64_t begin = data_.size();
  uint32_t width = dtype_bytes(dtype);
  data_.resize(begin + elems * width);
  std::byte* out = data_.data() + begin;
  for (uint64_t i = 0; i < elems; ++i) {
    if (dtype == DType::f32) {
      uint32_t bits = std::bit_cast<uint32_t>(values[i]);
      std::memcpy(out + i * 4, &bits, 4);  // little-endian host (x86_64, aarch64)
    } else {
      uint16_t h = dtype == DType::bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      std::memcpy(out + i * 2, &h, 2);
    }
  }
  tensors_.push_back({name, dtype, std::move(shape), begin, data_.size()});
  RT_ASSERT(tensors_.back().end_bytes - begin == elems * width, "tensor byte size");
  return {};
}

std::string SafetensorsWriter::header_json() const {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  for (const Tensor& t : tensors_) {
    header[t.name] = {{"dtype", std::string(safetensors_dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {t.begin_bytes, t.end_bytes}}};
  }
  return header.dump();
}

Status SafetensorsWriter::write(const std::string& path) const {
  std::string header = header_json();
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  RT_ASSERT((8 + header.size()) % 8 == 0, "data start must be 8-byte aligned");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(ErrorKind::failed, "safetensors: cannot open " + path);
  uint64_t n = header.size();
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(length, 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data_.data()),
            static_cast<std::streamsize>(data_.size()));
  out.close();
  if (!out) return make_error(ErrorKind::failed, "safetensors: writing " + path + " failed");
  return {};
}

}  // namespace tandem::devices
