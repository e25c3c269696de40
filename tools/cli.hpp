// The `tandem` program's subcommand table and a small flag parser shared by subcommands.
//
// Each subcommand lives in tools/cmd_<name>.cpp and exposes `int cmd_<name>(Args args)`.
// Flags are `--name value` or `--name=value`; `--help` prints the generated help and exits 0.
// A bad flag prints what was wrong and the help, and exits 2.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::cli {

using Args = std::span<char* const>;  // argv after the subcommand name

class Flags {
 public:
  // usage: e.g. "tandem check MANIFEST"; about: one paragraph printed under it.
  Flags(std::string usage, std::string about);

  // Declares a flag. `value_name` empty means a boolean switch (no value).
  Flags& flag(std::string name, std::string value_name, std::string help,
              std::optional<std::string> default_value = std::nullopt);
  // Declares a positional argument (in order). Optional ones must come last.
  Flags& positional(std::string name, std::string help, bool required = true);

  // Parses; on --help prints help and returns 0 in *exit_code; on error prints the problem
  // and help to stderr and returns 2 in *exit_code. Returns true when the caller proceeds.
  bool parse(Args args, int* exit_code);

  bool has(const std::string& name) const;  // given on the command line or defaulted
  std::string get(const std::string& name) const;  // flag or positional; "" if absent
  // Parses an integer flag; prints an error naming the flag and returns nullopt if bad.
  std::optional<int64_t> get_int(const std::string& name) const;
  std::optional<double> get_double(const std::string& name) const;
  const std::vector<std::string>& rest() const { return rest_; }  // after "--"
  std::string help() const;

 private:
  struct Flag {
    std::string name, value_name, help;
    std::optional<std::string> default_value;
  };
  struct Positional {
    std::string name, help;
    bool required;
  };
  std::string usage_, about_;
  std::vector<Flag> flags_;
  std::vector<Positional> positionals_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> rest_;
};

// The running program's own path (/proc/self/exe resolved); "" when it cannot be read.
std::string self_exe_path();

struct Command {
  std::string_view name;
  std::string_view summary;
  std::function<int(Args)> run;
};

}  // namespace tandem::cli
