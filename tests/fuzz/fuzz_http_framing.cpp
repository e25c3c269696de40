// Fuzz target: the HTTP server's framing checks (RequestFraming, STYLE.md §8, issue 12) from raw
// connection bytes. The first two input bytes pick the limits; the rest is what a client sends.
// Fed at once and fed one byte at a time, the bytes must give the same requests (where each
// ends, whether it wants a close, its path) and the same verdict at the same offset; a verdict
// is 400/413/431 with a printable message and a code; nothing throws or crashes. And kj agrees
// (no request smuggling past the checks): each request the checks pass, given to kj's own
// parser alone, is either refused as an unparseable head (kj answers 400/501 and closes) or
// parsed as exactly one request whose body kj reads to its end with nothing left over.
//   libFuzzer: see tests/fuzz/README.md
//   here: build/tests/fuzz_http_framing_replay tests/fuzz/corpus/http_framing (a test)
#include <kj/async.h>
#include <kj/compat/http.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "actors/gateway/http_framing.hpp"

namespace {

using tandem::gateway::RequestFraming;

void require(bool condition) {
  if (!condition) std::abort();  // a finding: the fuzzer (or the replay test) reports it
}

struct Trace {
  std::vector<size_t> ends;  // offset after each request's last byte
  std::vector<bool> closes;
  std::vector<std::string> paths;
  size_t failed_at = 0;  // offset after the offending byte; 0 = no verdict
  RequestFraming::Verdict verdict;
};

// Feeds `bytes` in pieces of at most `piece_bytes`.
Trace run(std::string_view bytes, uint64_t head_max, uint64_t body_max, size_t piece_bytes) {
  RequestFraming framing(head_max, body_max);
  Trace trace;
  size_t at = 0;
  while (at < bytes.size()) {
    size_t piece = std::min(piece_bytes, bytes.size() - at);
    size_t consumed = framing.feed(bytes.data() + at, piece);
    require(consumed <= piece);
    at += consumed;
    if (framing.failed()) {
      require(consumed > 0);
      trace.failed_at = at;
      trace.verdict = framing.verdict();
      return trace;
    }
    require(consumed > 0);
    if (framing.request_ended()) {
      require(framing.phase() == RequestFraming::Phase::idle);
      trace.ends.push_back(at);
      trace.closes.push_back(framing.close_wanted());
      trace.paths.push_back(framing.path());
    } else {
      require(consumed == piece);  // only a request's end stops a feed early
    }
  }
  return trace;
}

// The bytes of one request, as kj would read them from the GuardedStream.
class MemoryInput final : public kj::AsyncInputStream {
 public:
  explicit MemoryInput(std::string_view bytes) : bytes_(bytes) {}
  kj::Promise<size_t> tryRead(void* buffer, size_t, size_t max_bytes) override {
    size_t n = std::min(max_bytes, bytes_.size() - at_);  // short only at the end (EOF)
    if (n > 0) std::memcpy(buffer, bytes_.data() + at_, n);  // an empty view's data() may be null
    at_ += n;
    return n;
  }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
};

void check_with_kj(std::string_view request) {
  static kj::EventLoop loop;
  static kj::WaitScope wait_scope(loop);
  static kj::Own<kj::HttpHeaderTable> table = kj::HttpHeaderTable::Builder().build();
  MemoryInput input(request);
  auto http = kj::newHttpInputStream(input, *table);
  bool parsed = false;
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                 auto got = http->readRequest().wait(wait_scope);
                 parsed = true;
                 (void)got.body->readAllBytes().wait(wait_scope);
                 require(!http->awaitNextMessage().wait(wait_scope));  // nothing left over
               })) {
    // Only an unparseable head may be refused: never a body's framing, never after parsing.
    require(!parsed);
    require(std::string_view(e->getDescription().cStr()).find("bad request") !=
            std::string_view::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  uint64_t head_max = 16 + (uint64_t{data[0]} << 4);  // 16..4096
  uint64_t body_max = 1 + (uint64_t{data[1]} << 8);   // 1..65281
  std::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  Trace whole = run(bytes, head_max, body_max, bytes.size() + 1);
  Trace single = run(bytes, head_max, body_max, 1);
  Trace odd = run(bytes, head_max, body_max, 7);
  for (const Trace* other : {&single, &odd}) {
    require(other->ends == whole.ends);
    require(other->closes == whole.closes);
    require(other->paths == whole.paths);
    require(other->failed_at == whole.failed_at);
    require(other->verdict.status == whole.verdict.status);
    require(other->verdict.message == whole.verdict.message);
    require(other->verdict.code == whole.verdict.code);
  }
  size_t start = 0;
  for (size_t end : whole.ends) {
    check_with_kj(bytes.substr(start, end - start));
    start = end;
  }
  if (whole.failed_at > 0) {
    const auto& v = whole.verdict;
    require(v.status == 400 || v.status == 413 || v.status == 431);
    require(!v.message.empty() && !v.code.empty());
    for (char c : v.message) require(c >= 0x20 && c <= 0x7e);  // quoted client bytes included
  }
  return 0;
}
