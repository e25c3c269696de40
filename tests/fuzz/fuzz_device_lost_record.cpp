// Fuzz target: a node's device-lost record (runtime/node/device_lost_record.hpp), a file read
// back from disk by every node whose device is lost. Input: the file's bytes.
// parse_device_lost_record never crashes; it keeps at most kRecordStampsMax stamps; written out
// one per line, what it kept parses to the same stamps; and the restart rule on them keeps at
// most `max` stamps whatever they hold.
//   libFuzzer: build-fuzz/tests/fuzz_device_lost_record (tests/fuzz/README.md)
//   here: build/tests/fuzz_device_lost_record_replay tests/fuzz/corpus/device_lost_record
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/node/device_lost_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace rt = tandem::runtime;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int64_t> stamps = rt::parse_device_lost_record(text);
  if (stamps.size() > rt::kRecordStampsMax) std::abort();
  std::string written;
  for (int64_t t : stamps) written += std::to_string(t) + "\n";
  if (rt::parse_device_lost_record(written) != stamps) std::abort();
  // A wall clock's now (the node's): the stamps themselves may be anything.
  rt::allow_device_lost_restart(stamps, 1'765'000'000'000, 3'600'000, 3);
  if (stamps.size() > 3) std::abort();
  return 0;
}
