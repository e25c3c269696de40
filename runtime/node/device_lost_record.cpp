#include "runtime/node/device_lost_record.hpp"

#include "runtime/node/state_files.hpp"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace tandem::runtime {
namespace fs = std::filesystem;

bool allow_device_lost_restart(std::vector<int64_t>& stamps, int64_t now_ms, int64_t window_ms,
                               uint32_t max) {
  std::erase_if(stamps, [&](int64_t t) { return t <= now_ms - window_ms || t > now_ms; });
  std::sort(stamps.begin(), stamps.end());
  if (stamps.size() >= max) {
    stamps.erase(stamps.begin(), stamps.end() - max);
    return false;
  }
  stamps.push_back(now_ms);
  return true;
}

std::string device_lost_record_path(const std::string& cluster, const std::string& node,
                                    const std::string& manifest_file) {
  return state_file_path(cluster, node, manifest_file, ".device-lost");
}

std::vector<int64_t> parse_device_lost_record(std::string_view text) {
  std::vector<int64_t> stamps;
  while (!text.empty()) {
    const size_t eol = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, eol);
    text.remove_prefix(std::min(eol + 1, text.size()));
    int64_t v = 0;
    auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
    if (!line.empty() && ec == std::errc() && end == line.data() + line.size()) {
      stamps.push_back(v);
    }
  }
  if (stamps.size() > kRecordStampsMax) {
    stamps.erase(stamps.begin(), stamps.end() - static_cast<ptrdiff_t>(kRecordStampsMax));
  }
  return stamps;
}

std::vector<int64_t> read_device_lost_record(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text(kRecordBytesMax, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return parse_device_lost_record(text);
}

Status write_device_lost_record(const std::string& path, const std::vector<int64_t>& stamps) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) {
    return make_error(ErrorKind::failed, "cannot create " + fs::path(path).parent_path().string() +
                                             ": " + ec.message());
  }
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (int64_t t : stamps) out << t << '\n';
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      return make_error(ErrorKind::failed, "cannot write " + tmp);
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return make_error(ErrorKind::failed, "cannot rename " + tmp + " to " + path);
  }
  return {};
}

}  // namespace tandem::runtime
