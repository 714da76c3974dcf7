#pragma once
// Private: lists of names as options write them ("conv_proj,encoder.*.mlp"), one
// spelling for the option table, args.json, the front ends' words and the doctor.

#include <algorithm>
#include <string>
#include <vector>

namespace mixtrain::detail {

/// The pieces between commas, empty ones kept ("a,,b" -> a, "", b; "" -> one empty piece).
inline std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> out;
  for (size_t start = 0; start <= text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

/// The inverse: "a,b".
inline std::string comma_joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

/// The pieces as quoted strings for code: "\"a\", \"b\"".
inline std::string quoted_list(const std::string& text) {
  std::string out;
  for (const auto& n : comma_list(text)) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

} // namespace mixtrain::detail
