#include <doctest.h>

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
