// The admin shell's command table. Adding a command = adding one entry to
// shell_commands() in tools/shell_commands.cpp (a command with several forms, like `tier2`,
// has one entry per form, all with the same name and function: the first one runs).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/client/client.hpp"

namespace tandem::tools {

struct ShellContext {
  const config::Manifest* manifest;
  runtime::ClusterClient* client;
  std::chrono::milliseconds timeout{1000};
  bool quit = false;
  // --json: commands answer JSON documents here instead of text; run_shell_line prints them
  // (one as itself, several as an array).
  bool json = false;
  std::vector<std::string> json_items;
};

struct ShellCommand {
  std::string name;
  std::string usage;    // "ping TARGET [COUNT]"
  std::string summary;
  // Returns 0 on success, 1 on failure; prints its own output.
  std::function<int(ShellContext&, const std::vector<std::string>& args)> run;
};

const std::vector<ShellCommand>& shell_commands();

// Splits a line into words (whitespace; "double quotes" group).
std::vector<std::string> split_words(const std::string& line);

// Runs one command line. Unknown commands print a hint and return 1.
int run_shell_line(ShellContext& ctx, const std::string& line);

}  // namespace tandem::tools
