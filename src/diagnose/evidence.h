#pragma once
// Private: what a run's Recorder and precision callback say, as the doctor's evidence
// (evidence.cpp). summarize_run and bytes_per_param are public (diagnose/compare.h).

#include "mixtrain/diagnose/diagnosis.h"

#include <cstddef>
#include <string>

namespace mixtrain {
class Learner;
}

namespace mixtrain::diagnose::detail {

/// What the Recorder's steps from `from` on say, and what the mode counted: the part a
/// whole run and a replayed window share.
RunEvidence summarize_steps(Learner& learn, size_t from, const std::string& precision);

} // namespace mixtrain::diagnose::detail
