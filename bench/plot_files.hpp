// Writes rendered plots (bench/svg_plot) into a directory: the one piece of file I/O shared
// by `tandem bench serve --svg-dir`, `tandem sim --svg-dir` and `tandem bench sweep --out`.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::bench {

// Creates `dir` (and parents) when missing, then writes each (file name, text) into it.
// Errors: failed, naming the directory or file that could not be created or written.
Status write_files(const std::string& dir,
                   const std::vector<std::pair<std::string, std::string>>& files);

}  // namespace tandem::bench
