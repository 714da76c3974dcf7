#include "mixtrain/diagnose/fit_warning.h"

#include "mixtrain/core/precision_callback.h"
#include "mixtrain/diagnose/scale_analysis.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/util/warnings.h"

#include <algorithm>
#include <cstdio>

namespace mixtrain::diagnose {

Phrase lost_updates_warning(const LostUpdateReport& lost) {
  // Stochastic rounding and Kahan also leave most single steps unmoved, but keep
  // the updates (in expectation, or in the compensation): only nearest loses them.
  if (lost.keeps_dropped || lost.intended == 0 || lost.fraction < kLostUpdatesProblem) return Phrase();
  char line[512];
  std::string worst;
  if (!lost.worst.empty()) {
    const auto& w = lost.worst.front();
    std::snprintf(line, sizeof(line), " (worst: %s, %.0f%%%s)", w.name.c_str(), 100 * w.fraction,
                  w.never_moved ? ", never moved" : "");
    worst = line;
  }
  // A fact, not a verdict: at a normal learning rate most single bf16 updates round away
  // and the model may still train as fp32 does (the doctor then says healthy).
  std::snprintf(line, sizeof(line), "%.0f%% of weight updates rounded away in bf16%s", 100 * lost.fraction, worst.c_str());
  return line + ("; whether that costs accuracy, " + Phrase::doctor() +
                 " tells (the same steps in fp32); if it does, the cheapest cure is stochastic rounding of the update (" +
                 Phrase::setting("weight_update", "stochastic") + ", no extra memory)");
}

void FitWarning::before_fit(Learner& learn) {
  first_step_ = learn.recorder().steps().size();
  message_ = Phrase();
}

void FitWarning::after_fit(Learner& learn) {
  const auto& steps = learn.recorder().steps();
  const std::vector<StepRecord> this_fit(steps.begin() + std::min(first_step_, steps.size()), steps.end());
  message_ = fit_warning(analyze_scale_history(this_fit));
  if (const auto pc = learn.precision_cb(); message_.empty() && pc)
    if (const auto lost = pc->lost_updates()) message_ = lost_updates_warning(*lost);
  if (!message_.empty()) warn(message_);
}

} // namespace mixtrain::diagnose
