#pragma once
/// Precision: the five training precision modes as one value, with their names,
/// their options and the one call that attaches the right callback.
///
/// Example:
///   mixtrain::Precision p = mixtrain::parse_precision("bf16-master");
///   learn.set_precision(p, mixtrain::PrecisionOptions().master(mixtrain::amp::MasterWeightsOptions().flat_master(true)));
///   // the fastai-style one-liners do the same: learn.to_fp16(), learn.to_bf16(), learn.to_half(), learn.to_fp32()

#include "mixtrain/amp/grad_scaler.h"
#include "mixtrain/amp/master_weights.h"

#include <torch/arg.h>

#include <string>
#include <vector>

namespace mixtrain {

class Learner;

/// How a Learner trains.
enum class Precision {
  kFp32,        ///< "fp32": full precision, no callback
  kFp16,        ///< "fp16": fp16 autocast + dynamic loss scaling (GradScaler); emulated on CPU
  kBf16,        ///< "bf16": bf16 autocast, no loss scaling
  kFp16Master,  ///< "fp16-master": model stored in fp16, fp32 master weights (fastai v1); needs CUDA
  kBf16Master,  ///< "bf16-master": model stored in bf16, fp32 master weights
};

/// The mode's name: "fp32", "fp16", "bf16", "fp16-master" or "bf16-master".
std::string precision_name(Precision precision);
/// The mode a name denotes; throws c10::Error listing the names for anything else.
Precision parse_precision(const std::string& name);
/// Every mode, in declaration order.
std::vector<Precision> all_precisions();
/// Whether the mode scales the loss (fp16, fp16-master, bf16-master).
bool precision_scales_loss(Precision precision);
/// The dtype the mode computes in: kFloat (fp32), kHalf (fp16, fp16-master),
/// kBFloat16 (bf16, bf16-master). The one place this mapping is written.
c10::ScalarType compute_dtype(Precision precision);
/// Whether the mode keeps fp32 master weights (fp16-master, bf16-master).
bool uses_master_weights(Precision precision);
/// The mode that computes in `dtype`, with or without master weights (the inverse
/// of compute_dtype; kFloat is fp32).
Precision precision_for(c10::ScalarType dtype, bool master_weights);

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
};

/// Throws c10::Error naming the first option that `precision` cannot use, or a
/// mode that cannot run on `device` (fp16-master on a CPU). Options of other
/// modes are not checked.
void validate_precision(Precision precision, const PrecisionOptions& options, const torch::Device& device);

} // namespace mixtrain
