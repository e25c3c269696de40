// tandem/base: expected errors as values.
//
// An Error is an outcome the caller must handle (no eligible worker, overload, deadline
// passed, peer gone, malformed message, cache miss). Its kind tells the caller what to do:
//   invalid        the input was wrong; do not retry the same input
//   not_found      the named thing does not exist (unknown node, model, block)
//   overloaded     back off and retry later (a bounded queue is full)
//   disconnected   the peer is gone; reconnect or route elsewhere
//   timed_out      a deadline passed
//   unimplemented  the feature or value is not supported here; fall back
//   failed         anything else that went wrong at run time
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "runtime/base/assert.hpp"

namespace tandem {

enum class ErrorKind { invalid, not_found, overloaded, disconnected, timed_out, unimplemented, failed };

std::string_view to_string(ErrorKind kind);

struct Error {
  ErrorKind kind = ErrorKind::failed;
  std::string message;

  friend bool operator==(const Error&, const Error&) = default;
  std::string describe() const;  // "overloaded: send queue to node-b is full"
};

inline Error make_error(ErrorKind kind, std::string message) { return Error{kind, std::move(message)}; }

// Result<T>: either a value or an Error. Accessing the wrong alternative is a bug (asserted).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}      // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    RT_ASSERT(ok(), "Result::value() on an error:", std::get<1>(v_).describe());
    return std::get<0>(v_);
  }
  const T& value() const& {
    RT_ASSERT(ok(), "Result::value() on an error:", std::get<1>(v_).describe());
    return std::get<0>(v_);
  }
  T&& value() && {
    RT_ASSERT(ok(), "Result::value() on an error:", std::get<1>(v_).describe());
    return std::get<0>(std::move(v_));
  }
  const Error& error() const {
    RT_ASSERT(!ok(), "Result::error() on a value");
    return std::get<1>(v_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Error> v_;
};

// Result<void>: success or an Error.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT: implicit by design

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    RT_ASSERT(!ok_, "Result<void>::error() on success");
    return error_;
  }

 private:
  Error error_;
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace tandem
