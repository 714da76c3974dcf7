#pragma once
// Private: the first line of an exception's text. c10::Error's what() carries a
// backtrace after it, which is not for users' one-line messages.

#include <string>

namespace mixtrain::detail {

inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

/// The line that says what failed in a torch error: TorchScript's interpreter puts
/// its traceback first and the failing op's own message last, as "RuntimeError: ...".
inline std::string torch_error_cause(const std::string& message) {
  const size_t cause = message.rfind("RuntimeError: ");
  return first_line(cause == std::string::npos ? message : message.substr(cause + 14));
}

} // namespace mixtrain::detail
