#pragma once
/// Precision: the training precision modes as one value, with their names and
/// what each computes in. The vocabulary only: the options of each mode and the
/// callbacks that make it are amp's (mixtrain/amp/precision_options.h).
///
/// Example:
///   mixtrain::Precision p = mixtrain::parse_precision("bf16-master");
///   bool masters = mixtrain::uses_master_weights(p);  // true

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace mixtrain {

/// How a Learner trains.
enum class Precision {
  kFp32,        ///< "fp32": full precision, no callback
  kFp16,        ///< "fp16": fp16 autocast + dynamic loss scaling (GradScaler); emulated on CPU
  kBf16,        ///< "bf16": bf16 autocast, no loss scaling
  kFp16Master,  ///< "fp16-master": model stored in fp16, fp32 master weights (fastai v1); needs CUDA
  kBf16Master,  ///< "bf16-master": model stored in bf16, fp32 master weights
  kBf16Pure,    ///< "bf16-pure": weights, gradients and optimizer state bf16, no fp32 copy (amp/pure_bf16.h)
};

/// The mode's name: "fp32", "fp16", "bf16", "fp16-master", "bf16-master" or "bf16-pure".
std::string precision_name(Precision precision);
/// The mode a name denotes; throws c10::Error listing the names for anything else.
Precision parse_precision(const std::string& name);
/// Every mode, in declaration order.
std::vector<Precision> all_precisions();
/// Whether the mode scales the loss (fp16, fp16-master, bf16-master).
bool precision_scales_loss(Precision precision);
/// The dtype the mode computes in: kFloat (fp32), kHalf (fp16, fp16-master),
/// kBFloat16 (bf16, bf16-master, bf16-pure). The one place this mapping is written.
c10::ScalarType compute_dtype(Precision precision);
/// Whether the mode keeps fp32 master weights (fp16-master, bf16-master).
bool uses_master_weights(Precision precision);
/// The mode that computes in `dtype`, with or without master weights, or with
/// its weights and state stored in `dtype` itself (`pure`; bf16 only): the
/// inverse of compute_dtype (kFloat is fp32).
Precision precision_for(c10::ScalarType dtype, bool master_weights, bool pure = false);

} // namespace mixtrain
