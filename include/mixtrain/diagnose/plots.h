#pragma once
/// The doctor's charts: what a person would rather look at than read.

#include "mixtrain/diagnose/diagnosis.h"

#include <string>

namespace mixtrain::diagnose {

/// fp32 and mixed-precision loss per step (smoothed, with the raw losses faint).
std::string loss_curves_svg(const Evidence& evidence);
/// The mixed run's loss scale per step on a log2 axis, skipped steps marked in red.
std::string scale_history_svg(const RunEvidence& run);

} // namespace mixtrain::diagnose
