#include <doctest.h>

#include <cstdint>
#include <vector>

#include "runtime/base/huge_pages.hpp"
#include "runtime/base/result.hpp"

using tandem::Error;
using tandem::ErrorKind;
using tandem::Result;

TEST_CASE("Result carries a value or an error, never both") {
  Result<int> good = 7;
  CHECK(good.ok());
  CHECK(*good == 7);
  Result<int> bad = tandem::make_error(ErrorKind::overloaded, "queue full");
  CHECK_FALSE(bad.ok());
  CHECK(bad.error().kind == ErrorKind::overloaded);
  CHECK(bad.error().describe() == "overloaded: queue full");
  tandem::Status done;
  CHECK(done.ok());
  tandem::Status failed = Error{ErrorKind::disconnected, "peer gone"};
  CHECK(failed.error().describe() == "disconnected: peer gone");
}

TEST_CASE("HugePageAllocator: large tables 2 MiB-aligned, small ones ordinary, contents kept") {
  std::vector<uint64_t, tandem::HugePageAllocator<uint64_t>> small(100, 7);
  CHECK(small[99] == 7);
  std::vector<uint64_t, tandem::HugePageAllocator<uint64_t>> large(
      3 * tandem::kHugePageBytes / sizeof(uint64_t));
  CHECK(reinterpret_cast<uintptr_t>(large.data()) % tandem::kHugePageBytes == 0);
  for (size_t i = 0; i < large.size(); i += 4096) large[i] = i;
  large.resize(large.size() * 2);  // reallocates: the copy keeps what was written
  CHECK(reinterpret_cast<uintptr_t>(large.data()) % tandem::kHugePageBytes == 0);
  for (size_t i = 0; i < large.size() / 2; i += 4096) REQUIRE(large[i] == i);
  CHECK(large.back() == 0);
}
