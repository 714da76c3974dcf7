#pragma once
// What `train` and `doctor` build from their flags: the data split and the Learner.

#include "flags.h"

#include <mixtrain/mixtrain.h>

#include <memory>

namespace mixtrain_cli {

/// Loads the training split the flags ask for; data problems (and a configuration in
/// which one of `world_size` ranks would get no full batch, or no optimizer step) are
/// one-line errors.
mixtrain::data::DatasetSplit load_split(const mixtrain::RunConfig& r, int world_size);

/// The Learner train and doctor share: the model, data, loss and accuracy the
/// flags name, with gradient clipping and accumulation when asked for.
std::unique_ptr<mixtrain::Learner> build_learner(const mixtrain::RunConfig& r, const mixtrain::data::DatasetSplit& split,
                                                 bool progress);

} // namespace mixtrain_cli
