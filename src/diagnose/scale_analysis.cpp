#include "mixtrain/diagnose/scale_analysis.h"

#include "mixtrain/diagnose/diagnosis.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace mixtrain::diagnose {

ScaleAnalysis analyze_scale_history(const std::vector<StepRecord>& steps) {
  ScaleAnalysis a;
  a.steps = static_cast<int64_t>(steps.size());
  if (steps.empty()) return a;

  // Epochs are numbered per fit; a new epoch starts wherever the number changes.
  int64_t epoch_steps = 0, epoch_skipped = 0, epoch_index = 0, run = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& s = steps[i];
    if (i > 0 && s.epoch != steps[i - 1].epoch) {
      a.skip_rate_per_epoch.push_back(double(epoch_skipped) / epoch_steps);
      epoch_steps = epoch_skipped = 0;
      ++epoch_index;
    }
    ++epoch_steps;
    if (s.skipped) {
      ++a.skipped;
      ++epoch_skipped;
      a.longest_skip_run = std::max(a.longest_skip_run, ++run);
    } else {
      run = 0;
    }
    if (!std::isfinite(s.loss)) {
      if (a.first_nonfinite_step < 0) {
        a.first_nonfinite_step = static_cast<int64_t>(i);
        a.first_nonfinite_epoch = epoch_index;
      }
      ++a.nonfinite_losses;
    }
    if (std::isnan(s.scale)) continue;
    if (!a.has_scale) {
      a.has_scale = true;
      a.initial_scale = a.min_scale = a.max_scale = s.scale;
    }
    a.min_scale = std::min(a.min_scale, s.scale);
    a.max_scale = std::max(a.max_scale, s.scale);
    if (a.final_scale > 0 && s.scale < a.final_scale) ++a.backoffs;
    a.final_scale = s.scale;
  }
  a.skip_rate_per_epoch.push_back(double(epoch_skipped) / epoch_steps);
  a.skip_rate = double(a.skipped) / a.steps;
  while (a.settling_steps < a.steps && steps[a.settling_steps].skipped) ++a.settling_steps;
  if (a.settling_steps < a.steps && !std::isnan(steps[a.settling_steps].scale))
    a.settled_scale = steps[a.settling_steps].scale;
  a.skip_rate_after_settling = a.steps > a.settling_steps
                                   ? double(a.skipped - a.settling_steps) / (a.steps - a.settling_steps)
                                   : 0.0;
  // A fall, not a small start: a scale that began at 2^-20 by choice has not collapsed.
  a.collapsed = a.has_scale && a.min_scale <= 1.0 && a.min_scale < a.initial_scale;

  const int64_t tail = std::max<int64_t>(8, a.steps / 4);
  if (a.has_scale && a.steps >= tail && a.min_scale < a.initial_scale) {
    bool pinned = true;
    for (int64_t i = a.steps - tail; i < a.steps && pinned; ++i) pinned = steps[i].scale <= a.min_scale;
    const double first = steps[a.steps - tail].smooth_loss, last = steps.back().smooth_loss;
    const bool flat = std::isfinite(first) && std::isfinite(last) && std::abs(last - first) <= 0.02 * std::abs(first);
    a.pinned_at_min_with_flat_loss = pinned && flat;
  }
  return a;
}

bool skips_are_a_problem(const ScaleAnalysis& a) {
  return a.has_scale && a.skip_rate > kSkipRateProblem && (a.skipped == 0 || a.skipped > kCalibrationSkips);
}

Phrase fit_warning(const ScaleAnalysis& a) {
  if (!a.has_scale || a.steps == 0 || (!skips_are_a_problem(a) && !a.collapsed)) return Phrase();
  // What the run measured, said as facts. Which verdict they make (forward_overflow,
  // gradient_overflow, underflow) takes evidence a run does not keep: where the overflow
  // happens (the doctor's trace) and what fp32 does with the same batches.
  std::ostringstream s;
  s.precision(3);
  s << a.skipped << " of " << a.steps << " steps (" << 100 * a.skip_rate << "%) were skipped for inf/NaN gradients";
  if (a.collapsed)
    s << " and the loss scale collapsed (" << a.initial_scale << " -> lowest " << a.min_scale << " after " << a.backoffs
      << " back-offs)";
  if (a.nonfinite_losses > 0)
    s << "; " << a.nonfinite_losses << " loss" << (a.nonfinite_losses == 1 ? " was" : "es were") << " NaN/inf, the first at step "
      << a.first_nonfinite_step << " (a loss is computed before any scaling: the forward pass overflowed there)";
  Phrase out = s.str();
  if (a.settling_steps * 2 >= a.skipped && a.nonfinite_losses == 0) {
    std::ostringstream settling;
    settling.precision(3);
    settling << "; " << a.settling_steps << " of them were the first steps, backing off from the initial scale " << a.initial_scale
             << " (start lower: ";
    out += settling.str() + Phrase::name("init_scale") + ")";
  }
  return out + "; " + Phrase::doctor() + " tells which problem this is (it traces the overflow to its op and compares with fp32) and proves a fix";
}

} // namespace mixtrain::diagnose
