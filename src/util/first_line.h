#pragma once
// Private: the first line of an exception's text. c10::Error's what() carries a
// backtrace after it, which is not for users' one-line messages.

#include <string>

namespace mixtrain::detail {

inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

} // namespace mixtrain::detail
