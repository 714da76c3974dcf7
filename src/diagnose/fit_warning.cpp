#include "mixtrain/diagnose/fit_warning.h"

#include "mixtrain/core/precision_callback.h"
#include "mixtrain/diagnose/scale_analysis.h"
#include "mixtrain/diagnose/watch.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/util/warnings.h"

#include <algorithm>
#include <cmath>
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

WatchEvidence fit_evidence(const std::vector<StepRecord>& steps, const PrecisionCallback* precision) {
  WatchEvidence e;
  e.steps = static_cast<int64_t>(steps.size());
  if (precision && precision->loss_scaled() && !steps.empty() && !std::isnan(steps.front().scale)) {
    // The scale each step used is the scale after the step before it; after the last, the scaler's own.
    e.initial_scale = steps.front().scale;
    for (size_t i = 1; i < steps.size(); ++i) e.scales.push_back(steps[i].scale);
    e.scales.push_back(precision->loss_scale());
  }
  if (precision)
    if (const auto lost = precision->lost_updates()) {
      for (const auto& c : lost->per_param) e.lost.push_back({c.name, c.intended, c.lost});
      e.weight_update = lost->rule;
      e.lost_counted = "counted exactly in the update pass, since the mode was attached";
    }
  return e;
}

Phrase verdict_warning(const WatchReport& judged) {
  if (judged.verdict == "healthy") return Phrase();
  Phrase out = judged.verdict + ":";
  for (size_t i = 0; i < judged.evidence.size(); ++i) out += (i ? "; " : " ") + judged.evidence[i];
  out += "; the cure to try first: ";
  for (size_t i = 0; i < judged.cure.size(); ++i)
    out += (i ? Phrase(" or ") : Phrase()) + Phrase::setting(judged.cure[i].key, judged.cure[i].value);
  return out + "; " + Phrase::doctor() + " proves it (the same steps in fp32 and with the cure)";
}

void FitWarning::before_fit(Learner& learn) {
  first_step_ = learn.recorder().steps().size();
  message_ = Phrase();
}

void FitWarning::after_fit(Learner& learn) {
  const auto& steps = learn.recorder().steps();
  const std::vector<StepRecord> this_fit(steps.begin() + std::min(first_step_, steps.size()), steps.end());
  const auto pc = learn.precision_cb();
  // A verdict by the watch's rule first (one rule for a watched loop and a fit), else the
  // facts below a verdict that are still worth a line.
  message_ = verdict_warning(judge_watch(fit_evidence(this_fit, pc.get())));
  if (message_.empty()) message_ = fit_warning(analyze_scale_history(this_fit));
  if (message_.empty() && pc)
    if (const auto lost = pc->lost_updates()) message_ = lost_updates_warning(*lost);
  if (!message_.empty()) warn(message_);
}

} // namespace mixtrain::diagnose
