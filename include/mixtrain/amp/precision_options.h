#pragma once
/// PrecisionOptions: the options of every precision mode, and the glue that
/// turns a mode into its callback. Learner::set_precision and the fastai-style
/// one-liners (to_fp16, to_bf16, to_half, to_fp32), declared with the Learner,
/// are defined here in amp (src/amp/precision_options.cpp): the Learner's loop
/// knows only the PrecisionCallback interface.
///
/// Example:
///   learn.set_precision(mixtrain::Precision::kBf16Master,
///                       mixtrain::PrecisionOptions().master(mixtrain::amp::MasterWeightsOptions().flat_master(true)));

#include "mixtrain/amp/grad_scaler.h"
#include "mixtrain/amp/master_weights.h"
#include "mixtrain/amp/weight_update.h"
#include "mixtrain/core/precision.h"

#include <torch/arg.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace mixtrain {

/// The options of every mode; each mode reads its own.
struct PrecisionOptions {
  /// fp16: the GradScaler's options.
  TORCH_ARG(amp::GradScalerOptions, scaler);
  /// fp16-master / bf16-master: the master weights' options (their dtype is set by the mode).
  TORCH_ARG(amp::MasterWeightsOptions, master);
  /// fp16 on a CPU: emulate fp16 numerics (true) or make fit an error (false).
  TORCH_ARG(bool, allow_fp16_emulation) = true;
  /// fp32 islands: module paths or patterns ("encoder.layers.*.mlp") computed in
  /// fp32 under fp16, bf16 and the master-weights modes (mixtrain/amp/fp32_islands.h).
  /// set_precision throws OptionError("keep_fp32") for a name that matches no module.
  TORCH_ARG(std::vector<std::string>, keep_fp32);
  /// bf16-pure: how a bf16 weight takes its fp32 update (amp/weight_update.h).
  /// set_precision throws OptionError("weight_update") for another mode.
  TORCH_ARG(amp::WeightUpdate, weight_update) = amp::WeightUpdate::kNearest;
  /// bf16-pure with stochastic rounding: the seed of its random bits (the run's seed).
  TORCH_ARG(uint64_t, rounding_seed) = 0;
};

/// Throws c10::Error naming the first option that `precision` cannot use, or a
/// mode that cannot run on `device` (fp16-master on a CPU). Options of other
/// modes are not checked.
void validate_precision(Precision precision, const PrecisionOptions& options, const torch::Device& device);

} // namespace mixtrain
