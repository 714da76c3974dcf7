#pragma once
// Private: what a run's Recorder and precision callback say, as the doctor's evidence
// (evidence.cpp). summarize_run and bytes_per_param are public (diagnose/compare.h).

#include "mixtrain/diagnose/diagnosis.h"

#include <c10/core/Device.h>

#include <cstddef>
#include <string>

namespace mixtrain {
class Learner;
}
namespace mixtrain::diagnose {
class CompareOptions;
}

namespace mixtrain::diagnose::detail {

/// What the Recorder's steps from `from` on say, and what the mode counted: the part a
/// whole run and a replayed window share.
RunEvidence summarize_steps(Learner& learn, size_t from, const std::string& precision);

/// The validation loss of `learn`'s weights as they are (fp32, before it trains): the one
/// point both arms start from. NaN when there is no validation set.
double start_valid_loss(Learner& learn);

/// Why `o`'s precision cannot run on `device` (Evidence::unsupported), empty when it can.
Phrase why_unsupported(const CompareOptions& o, c10::Device device);

} // namespace mixtrain::diagnose::detail
