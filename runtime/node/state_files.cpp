#include "runtime/node/state_files.hpp"

#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace tandem::runtime {
namespace fs = std::filesystem;

namespace {

bool from_systemd() {
  const char* state = std::getenv("STATE_DIRECTORY");
  return state != nullptr && *state != '\0';
}

}  // namespace

std::string state_directory() {
  if (from_systemd()) {
    std::string dir = std::getenv("STATE_DIRECTORY");
    return dir.substr(0, dir.find(':'));  // several directories: the first
  }
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run && *run) {
    return std::string(run) + "/tandem";
  }
  return "/tmp/tandem-" + std::to_string(::getuid());
}

std::string state_file_path(const std::string& cluster, const std::string& node,
                            const std::string& manifest_file, const std::string& suffix) {
  std::error_code ec;
  fs::path manifest = fs::absolute(manifest_file, ec);
  std::string key = (ec ? fs::path(manifest_file) : manifest).lexically_normal().string();
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x",
                static_cast<unsigned>(XXH64(key.data(), key.size(), 0) & 0xffffffffu));
  return state_directory() + "/" + cluster + (node.empty() ? "" : "-" + node) + "-" + hex +
         suffix;
}

Status ensure_private_state_directory() {
  std::string dir = state_directory();
  std::error_code ec;
  if (from_systemd()) {  // systemd made it; someone else who set the variable may not have
    fs::create_directories(dir, ec);
    if (ec) return make_error(ErrorKind::failed, "cannot make " + dir + ": " + ec.message());
    return {};
  }
  fs::create_directories(fs::path(dir).parent_path(), ec);  // $XDG_RUNTIME_DIR exists already
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return make_error(ErrorKind::failed,
                      "cannot make the state directory " + dir + ": " + std::strerror(errno));
  }
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) {
    return make_error(ErrorKind::failed, "cannot read " + dir + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    return make_error(ErrorKind::failed,
                      "the state directory " + dir +
                          " is not a directory of this user writable only by it (someone else "
                          "made it?); remove it or set STATE_DIRECTORY");
  }
  return {};
}

}  // namespace tandem::runtime
