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

/// Where the threads go: to OpenBLAS for the transformer, whose steps are
/// mostly large matrix products; to libtorch's intra-op pool otherwise.
mixtrain::ThreadPolicy thread_policy(const mixtrain::RunConfig& r);

/// The model --model names: a built-in one, or a TorchScript file.
mixtrain::Model build_model(const mixtrain::RunConfig& r);

/// The Learner train and doctor share: the model, data, loss and metrics the
/// flags name (accuracy for classes, perplexity for the transformer), with
/// gradient clipping and accumulation when asked for. A model that does not run
/// on the data is a UsageError naming why.
std::unique_ptr<mixtrain::Learner> build_learner(const mixtrain::RunConfig& r, const mixtrain::data::DatasetSplit& split,
                                                 bool progress);

} // namespace mixtrain_cli
