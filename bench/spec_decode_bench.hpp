// `tandem bench spec-decode`: speculative decoding on a real model (issue 14). The decode
// engine as a decode instance runs it, minus the actors: DecodeScheduler (continuous
// batching, drafts planned in its budget), the cpu Device (stories15M by default) and
// verify_step (the rows verified exactly as the decode shell does), greedy. For each workload
// and stream count, each method (off, ngram, suffix) runs the same requests in the same
// process, one after another, and reports decode tok/s, tokens per sequence-step (1 +
// accepted drafts) and accepted drafts per drafted step, beside "off" as a ratio; it also
// checks that every method's text is byte-identical to off's.
//   fresh:  each prompt once (nothing repeats but what a story repeats itself).
//   again:  each prompt asked once untimed, then again timed (agents ask again): the suffix
//           cache holds the first answer; n-gram sees only the request itself.
//   echo:   the second ask carries the first answer in its prompt (an agent pasting what it
//           was shown): both proposers can copy it.
#pragma once

#include "tools/cli.hpp"

namespace tandem::bench {

int run_spec_decode_bench(cli::Args args);

}  // namespace tandem::bench
