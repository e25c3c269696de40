#include "bench/plot_files.hpp"

#include <filesystem>
#include <fstream>

#include "runtime/base/assert.hpp"

namespace tandem::bench {

Status write_files(const std::string& dir,
                   const std::vector<std::pair<std::string, std::string>>& files) {
  RT_ASSERT(!dir.empty());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return make_error(ErrorKind::failed, "cannot create directory " + dir +
                                             (ec ? ": " + ec.message() : std::string()));
  }
  for (const auto& [name, text] : files) {
    RT_ASSERT(!name.empty() && name.find('/') == std::string::npos, name);
    std::string path = dir + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out << text;
    if (!out) return make_error(ErrorKind::failed, "cannot write " + path);
  }
  return {};
}

}  // namespace tandem::bench
