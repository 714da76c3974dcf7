#pragma once
/// Charts of runs: the doctor's comparison (fp32 vs mixed loss, the loss-scale
/// history) and any run's own (loss, schedule, scale), as SVG a person would
/// rather look at than read.

#include "mixtrain/diagnose/diagnosis.h"
#include "mixtrain/core/recorder.h"

#include <string>

namespace mixtrain::diagnose {

/// fp32 and mixed-precision loss per step (smoothed, with the raw losses faint).
/// With `trials`, their mixed runs too (thin lines, one color each).
std::string loss_curves_svg(const Evidence& evidence, const std::vector<Trial>& trials = {});
/// The mixed run's loss scale per step on a log2 axis, skipped steps marked in red.
std::string scale_history_svg(const RunEvidence& run);

// ---- Any run's charts, from its Recorder (fastai's plot_loss / plot_sched).

/// Per-step loss (faint) and smoothed loss, per-epoch validation loss (markers at
/// each epoch's last step), epoch boundaries dotted.
std::string plot_loss(const Recorder& recorder);
/// Learning rate and momentum per step, each on its own chart, stacked in one SVG.
std::string plot_sched(const Recorder& recorder);
/// The loss scale per step (log2 axis), skipped steps in red; empty string when
/// no step recorded a scale.
std::string plot_scale(const Recorder& recorder);

} // namespace mixtrain::diagnose
