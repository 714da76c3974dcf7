// Why the doctor stops trying fixes (mixtrain/diagnose/trial_stop.h): said in words, so
// the report, diagnosis.json and Python carry the same sentence.
#include "mixtrain/diagnose/trial_stop.h"

#include "util/short_number.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace mixtrain::diagnose {

std::string why_trials_stop(const Trial& trial, double run_bytes, const std::vector<Fix>& waiting) {
  if (!trial.proven() || waiting.empty() || !std::isfinite(run_bytes) || !std::isfinite(trial.run.bytes_per_param))
    return {};
  const bool none_cheaper = std::all_of(waiting.begin(), waiting.end(), [&](const Fix& f) {
    return run_bytes + f.min_extra_bytes >= trial.run.bytes_per_param - 1e-9;
  });
  if (!none_cheaper) return {};
  return "the proven fix costs " + mixtrain::detail::short_number(trial.run.bytes_per_param, 3) +
         " bytes a parameter: none of the " + std::to_string(waiting.size()) + " fix(es) still waiting could be cheaper";
}

} // namespace mixtrain::diagnose
