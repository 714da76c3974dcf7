#include "mixtrain/diagnose/fit_warning.h"

#include "mixtrain/core/precision_callback.h"
#include "mixtrain/diagnose/scale_analysis.h"
#include "mixtrain/core/learner.h"

#include <algorithm>
#include <cstdio>
#include <iostream>

namespace mixtrain::diagnose {

std::string lost_updates_warning(const LostUpdateReport& lost) {
  // Stochastic rounding and Kahan also leave most single steps unmoved, but keep
  // the updates (in expectation, or in the compensation): only nearest loses them.
  if (lost.keeps_dropped || lost.intended == 0 || lost.fraction < kLostUpdatesProblem) return "";
  char line[512];
  std::string worst;
  if (!lost.worst.empty()) {
    const auto& w = lost.worst.front();
    std::snprintf(line, sizeof(line), " (worst: %s, %.0f%%%s)", w.name.c_str(), 100 * w.fraction,
                  w.never_moved ? ", never moved" : "");
    worst = line;
  }
  std::snprintf(line, sizeof(line), "likely lost_updates: %.0f%% of weight updates rounded away%s", 100 * lost.fraction,
                worst.c_str());
  std::string message = line;
  message += "; the cheapest cure is stochastic rounding of the update (weight_update stochastic, no extra memory), "
               "then a Kahan compensation (+2 bytes per parameter) or fp32 weights";
  return message;
}

void FitWarning::before_fit(Learner& learn) {
  first_step_ = learn.recorder().steps().size();
  message_.clear();
}

void FitWarning::after_fit(Learner& learn) {
  const auto& steps = learn.recorder().steps();
  const std::vector<StepRecord> this_fit(steps.begin() + std::min(first_step_, steps.size()), steps.end());
  message_ = fit_warning(analyze_scale_history(this_fit));
  if (const auto pc = learn.precision_cb(); message_.empty() && pc)
    if (const auto lost = pc->lost_updates()) message_ = lost_updates_warning(*lost);
  if (!message_.empty()) std::cerr << "mixtrain: warning: " << message_ << std::endl;
}

} // namespace mixtrain::diagnose
