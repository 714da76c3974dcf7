#pragma once
/// Reads the Recorder's per-step loss-scale history the way the fp16 troubleshooting guide tells a
/// person to read `learn.scales`: skip rate, collapse, a scale pinned at its
/// minimum while the loss is flat.

#include "mixtrain/core/recorder.h"
#include "mixtrain/util/phrase.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain::diagnose {

struct ScaleAnalysis {
  int64_t steps = 0;
  int64_t skipped = 0;
  double skip_rate = 0;                    ///< skipped / steps
  std::vector<double> skip_rate_per_epoch; ///< one per epoch, in order
  bool has_scale = false;                  ///< a loss scaler was active (the scale column is set)
  double initial_scale = 0, final_scale = 0, min_scale = 0, max_scale = 0;
  int64_t backoffs = 0;                    ///< steps after which the scale went down
  int64_t longest_skip_run = 0;            ///< most consecutive skipped steps
  /// Skipped steps in a row from the first step: the scaler finding its level
  /// from an initial scale set too high. Normal in a long run, costly in a short one.
  int64_t settling_steps = 0;
  double settled_scale = 0;  ///< the scale of the first step that was not skipped (0 if none)
  /// The skip rate after settling: how often gradients overflow once the scale found its level.
  double skip_rate_after_settling = 0;
  /// Repeated back-off down to tiny scales: the scale fell (from above) to <= 1,
  /// so even the unscaled gradients overflow fp16.
  bool collapsed = false;
  /// The last quarter of the steps (at least 8) all at the lowest scale seen,
  /// below the initial one, while the smoothed loss moved less than 2%.
  bool pinned_at_min_with_flat_loss = false;
  int64_t nonfinite_losses = 0;            ///< steps whose loss was NaN/Inf
  int64_t first_nonfinite_step = -1;       ///< index into the steps analysed, -1 if none
  int64_t first_nonfinite_epoch = -1;      ///< its epoch (0 = the first epoch analysed)
};

/// Analyses `steps` (e.g. recorder().steps(), or the tail one fit wrote).
ScaleAnalysis analyze_scale_history(const std::vector<StepRecord>& steps);

/// A few skipped steps are the scaler finding its level below its initial scale
/// (each back-off costs one step; 3 take the default 2^16 to 2^13), normal in any
/// run, as the troubleshooting guide says; in a 32-step run they alone pass 5%.
constexpr int64_t kCalibrationSkips = 3;

/// Whether the run skipped too many steps: more than kSkipRateProblem of them, and
/// more than the kCalibrationSkips a scaler needs to find its level.
bool skips_are_a_problem(const ScaleAnalysis& a);

/// The one-line warning a loss-scaled fit ends with when it skipped more than 5%
/// of its steps or its scale collapsed (fastai stays silent); empty when neither.
/// It says what the run measured (skips, the scale's fall, NaN losses) and names the
/// doctor for the verdict: which of forward_overflow, gradient_overflow or underflow it
/// is takes what a run does not record (the overflow's op, fp32 on the same batches).
Phrase fit_warning(const ScaleAnalysis& fit);

} // namespace mixtrain::diagnose
