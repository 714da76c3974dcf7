#pragma once
/// When the doctor's trials may stop early. The trials run cheapest first, in bytes a
/// parameter, and the proven fix is the cheapest trial that trains like fp32; so once a
/// trial is proven, the fixes still waiting need not run if none of them can cost less.

#include "mixtrain/diagnose/diagnosis.h"

#include <string>
#include <vector>

namespace mixtrain::diagnose {

/// Why the trials stop after `trial`, given the fixes still `waiting` and `run_bytes`, the
/// bytes a parameter of the run under diagnosis (a fix adds fp32 to it, never takes it
/// away, so a waiting fix costs at least run_bytes + its Fix::min_extra_bytes). Empty when
/// they go on: the trial is not proven, nothing waits, a cost is unknown (not finite), or
/// some waiting fix could be cheaper than the trial.
std::string why_trials_stop(const Trial& trial, double run_bytes, const std::vector<Fix>& waiting);

} // namespace mixtrain::diagnose
