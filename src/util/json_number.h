#pragma once
// Private: numbers in the JSON files mixtrain writes (summary.json, diagnosis.json).

#include <nlohmann/json.hpp>

#include <cmath>

namespace mixtrain::detail {

/// JSON has no NaN or Inf: they are written as null, because a diverged run
/// must still produce a readable file.
inline nlohmann::json json_number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

} // namespace mixtrain::detail
