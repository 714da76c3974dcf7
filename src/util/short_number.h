#pragma once
// Private: numbers as mixtrain prints them in findings, fixes and chart labels.

#include <sstream>
#include <string>

namespace mixtrain::detail {

/// `v` with at most `digits` significant digits ("3.142", "6.554e+04"): enough
/// to read a magnitude, short enough for a one-line finding or an axis label.
inline std::string short_number(double v, int digits = 4) {
  std::ostringstream s;
  s.precision(digits);
  s << v;
  return s.str();
}

} // namespace mixtrain::detail

namespace mixtrain::diagnose::detail {
using mixtrain::detail::short_number;
} // namespace mixtrain::diagnose::detail
