#include "runtime/base/result.hpp"

namespace tandem {

std::string_view to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid: return "invalid";
    case ErrorKind::not_found: return "not_found";
    case ErrorKind::overloaded: return "overloaded";
    case ErrorKind::disconnected: return "disconnected";
    case ErrorKind::timed_out: return "timed_out";
    case ErrorKind::unimplemented: return "unimplemented";
    case ErrorKind::failed: return "failed";
  }
  return "failed";
}

std::string Error::describe() const {
  std::string out(to_string(kind));
  out += ": ";
  out += message;
  return out;
}

}  // namespace tandem
