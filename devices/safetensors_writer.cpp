#include "devices/safetensors_writer.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
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

Result<uint64_t> SafetensorsWriter::check_new(const std::string& name,
                                              const std::vector<uint64_t>& shape,
                                              uint64_t values_count) const {
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
  if (elems != values_count) {
    return invalid("shape holds " + std::to_string(elems) + " elements, " +
                   std::to_string(values_count) + " given");
  }
  return elems;
}

Status SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<uint64_t> shape,
                              std::span<const float> values) {
  auto elems = check_new(name, shape, values.size());
  if (!elems) return elems.error();
  if (dtype == DType::f8_e4m3) {
    return make_error(ErrorKind::invalid,
                      "safetensors: tensor '" + name + "': F8_E4M3 is not supported for writing");
  }
  uint64_t begin = data_.size();
  uint32_t width = dtype_bytes(dtype);
  data_.resize(begin + *elems * width);
  std::byte* out = data_.data() + begin;
  for (uint64_t i = 0; i < *elems; ++i) {
    if (dtype == DType::f32) {
      uint32_t bits = std::bit_cast<uint32_t>(values[i]);
      std::memcpy(out + i * 4, &bits, 4);  // little-endian host (x86_64, aarch64)
    } else {
      uint16_t h = dtype == DType::bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      std::memcpy(out + i * 2, &h, 2);
    }
  }
  tensors_.push_back({name, std::string(safetensors_dtype_name(dtype)), std::move(shape), begin,
                      data_.size()});
  RT_ASSERT(tensors_.back().end_bytes - begin == *elems * width, "tensor byte size");
  return {};
}

Status SafetensorsWriter::add_i64(const std::string& name, std::vector<uint64_t> shape,
                                  std::span<const int64_t> values) {
  auto elems = check_new(name, shape, values.size());
  if (!elems) return elems.error();
  uint64_t begin = data_.size();
  data_.resize(begin + *elems * 8);
  std::memcpy(data_.data() + begin, values.data(), *elems * 8);  // little-endian host
  tensors_.push_back({name, "I64", std::move(shape), begin, data_.size()});
  return {};
}

std::string SafetensorsWriter::header_json() const { return header_json(0, tensors_.size()); }

std::string SafetensorsWriter::header_json(size_t first, size_t last) const {
  RT_ASSERT(first <= last, "tensor range", first, last);
  RT_ASSERT(last <= tensors_.size(), "tensor range end", last, tensors_.size());
  // Offsets are relative to the range's data: tensors are stored back to back in add order.
  uint64_t base_bytes = first < last ? tensors_[first].begin_bytes : 0;
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  for (size_t i = first; i < last; ++i) {
    const Tensor& t = tensors_[i];
    header[t.name] = {{"dtype", t.dtype_name},
                      {"shape", t.shape},
                      {"data_offsets", {t.begin_bytes - base_bytes, t.end_bytes - base_bytes}}};
  }
  return header.dump();
}

Status SafetensorsWriter::write(const std::string& path) const {
  return write_range(path, 0, tensors_.size());
}

Status SafetensorsWriter::write_range(const std::string& path, size_t first, size_t last) const {
  std::string header = header_json(first, last);
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  RT_ASSERT((8 + header.size()) % 8 == 0, "data start must be 8-byte aligned");
  uint64_t begin = first < last ? tensors_[first].begin_bytes : 0;
  uint64_t end = first < last ? tensors_[last - 1].end_bytes : 0;
  RT_ASSERT(begin <= end && end <= data_.size(), "range bytes", begin, end, data_.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(ErrorKind::failed, "safetensors: cannot open " + path);
  uint64_t n = header.size();
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(length, 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data_.data() + begin),
            static_cast<std::streamsize>(end - begin));
  out.close();
  if (!out) return make_error(ErrorKind::failed, "safetensors: writing " + path + " failed");
  return {};
}

std::string SafetensorsWriter::shard_file_name(uint32_t shard_number, uint32_t shard_count) {
  RT_ASSERT(shard_number >= 1, "shard numbers start at 1", shard_number);
  RT_ASSERT(shard_number <= shard_count, "shard number", shard_number, shard_count);
  RT_ASSERT(shard_count <= kShardCountMax, "shard count", shard_count);
  char name[64];
  std::snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", shard_number, shard_count);
  return name;
}

std::vector<size_t> SafetensorsWriter::shard_starts(uint32_t shard_count) const {
  size_t n = tensors_.size();
  RT_ASSERT(shard_count >= 1, "shard count", shard_count);
  RT_ASSERT(shard_count <= n, "more shards than tensors", shard_count, n);
  uint64_t total_bytes = data_.size();
  std::vector<size_t> starts;
  size_t next = 0;
  for (uint32_t k = 0; k < shard_count; ++k) {
    starts.push_back(next);
    ++next;  // every shard holds at least one tensor
    uint64_t target_bytes = total_bytes * (k + 1) / shard_count;
    size_t shards_left = shard_count - 1 - k;  // each needs a tensor of its own
    while (next < n - shards_left && tensors_[next].end_bytes <= target_bytes) ++next;
  }
  RT_ASSERT(starts.size() == shard_count, "one start per shard");
  RT_ASSERT(next == n, "the shards cover every tensor", next, n);
  return starts;
}

namespace {

// "model-DDDDD-of-DDDDD.safetensors"
bool is_shard_file_name(const std::string& name) {
  if (name.size() != 32 || name.compare(0, 6, "model-") != 0) return false;
  if (name.compare(11, 4, "-of-") != 0 || name.compare(20, 12, ".safetensors") != 0) return false;
  for (size_t i : {6u, 7u, 8u, 9u, 10u, 15u, 16u, 17u, 18u, 19u}) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return true;
}

// Removes checkpoint files a previous write may have left in `dir` (see write_checkpoint).
Status remove_old_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    bool shard = is_shard_file_name(name);
    if (shard || name == "model.safetensors" || name == "model.safetensors.index.json") {
      stale.push_back(entry.path());
    }
  }
  if (ec) return make_error(ErrorKind::failed, "cannot list " + dir.string() + ": " + ec.message());
  for (const auto& path : stale) {
    if (!std::filesystem::remove(path, ec) && ec) {
      return make_error(ErrorKind::failed, "cannot remove " + path.string() + ": " + ec.message());
    }
  }
  return {};
}

}  // namespace

Status SafetensorsWriter::write_checkpoint(const std::string& dir, uint32_t shard_count) const {
  if (shard_count == 0 || shard_count > kShardCountMax || shard_count > tensors_.size()) {
    return make_error(ErrorKind::invalid,
                      "safetensors: " + std::to_string(shard_count) + " shards: must be in [1, " +
                          std::to_string(std::min<size_t>(kShardCountMax, tensors_.size())) +
                          "] (one tensor per shard at least; " +
                          std::to_string(tensors_.size()) + " tensors)");
  }
  std::filesystem::path root(dir);
  if (Status st = remove_old_checkpoint(root); !st) return st;
  if (shard_count == 1) return write((root / "model.safetensors").string());
  std::vector<size_t> starts = shard_starts(shard_count);
  nlohmann::json weight_map = nlohmann::json::object();  // std::map: keys sorted, as HF
  for (uint32_t k = 0; k < shard_count; ++k) {
    size_t last = k + 1 < shard_count ? starts[k + 1] : tensors_.size();
    std::string file = shard_file_name(k + 1, shard_count);
    if (Status st = write_range((root / file).string(), starts[k], last); !st) return st;
    for (size_t i = starts[k]; i < last; ++i) weight_map[tensors_[i].name] = file;
  }
  RT_ASSERT(weight_map.size() == tensors_.size(), "every tensor in the weight map");
  nlohmann::json index = {{"metadata", {{"total_size", data_.size()}}},
                          {"weight_map", std::move(weight_map)}};
  std::string path = (root / "model.safetensors.index.json").string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << index.dump(2) << "\n";
  out.close();
  if (!out) return make_error(ErrorKind::failed, "safetensors: writing " + path + " failed");
  return {};
}

}  // namespace tandem::devices
