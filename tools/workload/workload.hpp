// Workload generators for `tandem bench` and `tandem sim` (issue 5): the agentic coding
// workload, plus the usual `random` and `shared-prefix` shapes, and JSONL traces.
//
// Pure: no clocks, threads or I/O (JSONL goes to and from strings; the caller does files).
// Everything derives from the seed: same parameters, same trace, byte for byte.
//
// Prompts are kept compact as segments (seed, length) whose token ids are a pure function of
// the segment, so a trace of millions of prompt tokens costs little memory; token_ids()
// materializes a prompt. Prefixes are shared exactly: the system prompt by every session,
// a repository's context by that repository's sessions, the history within a session.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::workload {

enum class SegmentKind { system, repo, task, assistant, tool, random, prefix, suffix, literal };
std::string_view to_string(SegmentKind kind);

// tokens_count token ids, each a pure function of (seed, position) in [0, vocab_size).
struct Segment {
  SegmentKind kind = SegmentKind::random;
  uint64_t seed = 0;
  uint32_t tokens_count = 0;
  uint32_t vocab_size = 1;
  friend bool operator==(const Segment&, const Segment&) = default;
};

struct Request {
  uint32_t session = 0;  // agentic: session index; shared-prefix: group; random: request
  uint32_t turn = 0;     // 0-based within the session
  int32_t repo = -1;     // agentic: repository index; -1 otherwise
  // Arrival offset from the start of the run, ms, assuming instant responses (open loop).
  double arrival_offset_ms = 0;
  // Delay between the session's previous response and this request, ms (closed-loop
  // replay); 0 for a session's first turn.
  double think_time_ms = 0;
  uint32_t expected_output_tokens = 0;
  // Exactly one prompt form is used: segments (generated), token ids or text (read).
  std::vector<Segment> segments;
  std::vector<uint32_t> prompt_token_ids;
  std::string prompt_text;

  uint64_t prompt_tokens_count() const;  // segments' sum, or token ids' count; text: 0
};

// The agentic coding workload. Defaults follow issue 5.
struct AgenticParams {
  uint64_t seed = 1;
  uint32_t vocab_size = 200064;
  uint32_t sessions_count = 64;          // sessions generated in total
  uint32_t sessions_in_flight = 8;       // N: a new session starts when one ends
  uint32_t system_prompt_tokens = 8192;  // shared by every session (tool definitions)
  uint32_t repos_count = 12;
  double repo_popularity_zipf_s = 1.0;      // P(repo k) proportional to 1 / (k + 1)^s
  uint32_t repo_context_tokens_min = 5000;  // per repository, uniform in [min, max]
  uint32_t repo_context_tokens_max = 40000;
  double task_tokens_median = 300;  // task statement: lognormal
  double task_tokens_sigma = 0.5;
  double tool_output_tokens_median = 800;  // new tokens per turn: lognormal (long tail)
  double tool_output_tokens_sigma = 1.0;
  uint32_t tool_output_tokens_max = 32000;
  uint32_t output_tokens_min = 300;  // per turn, uniform in [min, max]
  uint32_t output_tokens_max = 600;
  uint32_t turns_min = 20;  // per session, uniform in [min, max]
  uint32_t turns_max = 80;
  double think_time_ms_median = 1000;  // between a response and the next turn: lognormal
  double think_time_ms_sigma = 1.0;
  double session_start_stagger_ms = 500;  // in-flight slot j starts at j * stagger
  // A session ends early when its next prompt plus output would pass this (model length).
  uint32_t context_tokens_max = 204800;
};

struct RandomParams {
  uint64_t seed = 1;
  uint32_t vocab_size = 200064;
  uint32_t requests_count = 1000;
  uint32_t input_tokens = 1024;   // uniform in [input * (1 - r), input * (1 + r)]
  uint32_t output_tokens = 128;   // same range rule
  double range_ratio = 0.0;       // r in [0, 1)
  double request_rate_per_s = 0;  // Poisson arrivals; 0 = every request at offset 0
};

struct SharedPrefixParams {
  uint64_t seed = 1;
  uint32_t vocab_size = 200064;
  uint32_t groups_count = 8;  // distinct shared prefixes
  uint32_t prompts_per_group = 16;
  uint32_t prefix_tokens = 2048;
  uint32_t suffix_tokens = 256;  // unique per prompt
  uint32_t output_tokens = 128;
  double request_rate_per_s = 0;  // Poisson arrivals; 0 = every request at offset 0
};

// Errors: invalid, naming the first bad field. Requests come sorted by arrival offset
// (ties: session, then turn).
Result<std::vector<Request>> generate_agentic(const AgenticParams& params);
Result<std::vector<Request>> generate_random(const RandomParams& params);
Result<std::vector<Request>> generate_shared_prefix(const SharedPrefixParams& params);

// The prompt's token ids (segments materialized, or the stored ids; text: empty).
std::vector<uint32_t> token_ids(const Request& request);
void append_token_ids(const Segment& segment, std::vector<uint32_t>& out);

// JSONL: one request per line:
//   {"session":0,"turn":0,"repo":3,"arrival_offset_ms":0.0,"think_time_ms":0.0,
//    "expected_output_tokens":412,"prompt_token_ids":[...]}   (or "prompt":"text")
// "repo" and "think_time_ms" are optional on read. Segments are written materialized.
std::string to_jsonl_line(const Request& request);           // no trailing newline
std::string to_jsonl(const std::vector<Request>& requests);  // lines, each ending in '\n'
// Errors: invalid, "line N: ..." naming the 1-based line and the bad field. Blank lines
// are skipped.
Result<Request> parse_jsonl_line(std::string_view line, size_t line_number);
Result<std::vector<Request>> read_jsonl(std::string_view text);

}  // namespace tandem::workload
