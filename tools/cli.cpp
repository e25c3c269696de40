#include "tools/cli.hpp"

#include <unistd.h>

#include <charconv>
#include <climits>
#include <cstdio>
#include <cstdlib>

namespace tandem::cli {

std::string self_exe_path() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

Flags::Flags(std::string usage, std::string about)
    : usage_(std::move(usage)), about_(std::move(about)) {}

Flags& Flags::flag(std::string name, std::string value_name, std::string help,
                   std::optional<std::string> default_value) {
  flags_.push_back({std::move(name), std::move(value_name), std::move(help),
                    std::move(default_value)});
  return *this;
}

Flags& Flags::positional(std::string name, std::string help, bool required) {
  positionals_.push_back({std::move(name), std::move(help), required});
  return *this;
}

std::string Flags::help() const {
  std::string out = "usage: " + usage_ + "\n\n" + about_ + "\n";
  if (!positionals_.empty()) {
    out += "\narguments:\n";
    for (const auto& p : positionals_) {
      out += "  " + p.name + (p.required ? "" : " (optional)") + "\n      " + p.help + "\n";
    }
  }
  out += "\nflags:\n";
  for (const auto& f : flags_) {
    out += "  --" + f.name + (f.value_name.empty() ? "" : " " + f.value_name) + "\n      " +
           f.help;
    if (f.default_value && !f.value_name.empty()) out += " (default: " + *f.default_value + ")";
    out += "\n";
  }
  out += "  --help\n      print this help and exit\n";
  return out;
}

bool Flags::parse(Args args, int* exit_code) {
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "error: %s\n\n%s", why.c_str(), help().c_str());
    *exit_code = 2;
    return false;
  };
  size_t next_positional = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--") {
      for (++i; i < args.size(); ++i) rest_.emplace_back(args[i]);
      break;
    }
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      *exit_code = 0;
      return false;
    }
    if (arg.rfind("--", 0) == 0) {
      std::string name = arg.substr(2), value;
      bool inline_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        inline_value = true;
      }
      const Flag* found = nullptr;
      for (const auto& f : flags_) {
        if (f.name == name) found = &f;
      }
      if (!found) return fail("unknown flag --" + name);
      if (found->value_name.empty()) {
        if (inline_value) return fail("--" + name + " takes no value");
        values_[name] = "true";
        continue;
      }
      if (!inline_value) {
        if (i + 1 >= args.size()) return fail("--" + name + " needs a value " + found->value_name);
        value = args[++i];
      }
      values_[name] = value;
      continue;
    }
    if (next_positional >= positionals_.size()) return fail("unexpected argument '" + arg + "'");
    values_[positionals_[next_positional++].name] = arg;
  }
  for (size_t p = next_positional; p < positionals_.size(); ++p) {
    if (positionals_[p].required) return fail("missing argument " + positionals_[p].name);
  }
  for (const auto& f : flags_) {
    if (f.default_value && !values_.count(f.name)) values_[f.name] = *f.default_value;
  }
  return true;
}

bool Flags::has(const std::string& name) const { return values_.count(name) > 0; }

std::string Flags::get(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second;
}

std::optional<int64_t> Flags::get_int(const std::string& name) const {
  std::string text = get(name);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    std::fprintf(stderr, "error: --%s expects an integer, got '%s'\n", name.c_str(), text.c_str());
    return std::nullopt;
  }
  return value;
}

std::optional<double> Flags::get_double(const std::string& name) const {
  std::string text = get(name);
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    std::fprintf(stderr, "error: --%s expects a number, got '%s'\n", name.c_str(), text.c_str());
    return std::nullopt;
  }
  return value;
}

}  // namespace tandem::cli
