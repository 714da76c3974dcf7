#include "mixtrain/diagnose/fit_warning.h"

#include "mixtrain/diagnose/scale_analysis.h"
#include "mixtrain/core/learner.h"

#include <algorithm>
#include <iostream>

namespace mixtrain::diagnose {

void FitWarning::before_fit(Learner& learn) {
  first_step_ = learn.recorder().steps().size();
  message_.clear();
}

void FitWarning::after_fit(Learner& learn) {
  const auto& steps = learn.recorder().steps();
  const std::vector<StepRecord> this_fit(steps.begin() + std::min(first_step_, steps.size()), steps.end());
  message_ = fit_warning(analyze_scale_history(this_fit));
  if (!message_.empty()) std::cerr << "mixtrain: warning: " << message_ << std::endl;
}

} // namespace mixtrain::diagnose
