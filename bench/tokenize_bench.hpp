// `tandem bench tokenize`: the gateway's per-request CPU work on a long prompt, part by part.
//
// Builds a coding-agent-like text (prose, code with indentation, a JSON tool result) of about
// `tokens` tokens, then times, each repeated until `seconds` of wall time has passed:
//   tokenize   Tokenizer::encode of the whole text (what the gateway does per request);
//   hash       the block hashes of the resulting ids (kv::hash_blocks, block 16), the baseline
//              in the same run: the other per-token pass every request makes.
// Prints per run the time and the tokens per second, and tokenize / hash as a ratio.
#pragma once

#include "tools/cli.hpp"

namespace tandem::bench {

int run_tokenize_bench(cli::Args args);

}  // namespace tandem::bench
