// The glue between the Precision vocabulary and amp's callbacks: the options a
// mode accepts, and the Learner's precision one-liners, which attach the mode's
// callback. The Learner declares them; its loop knows only PrecisionCallback.
#include "mixtrain/amp/precision_options.h"

#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/amp/master_weights.h"
#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/amp/pure_bf16.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/util/option_error.h"

namespace mixtrain {

void validate_precision(Precision precision, const PrecisionOptions& options, const torch::Device& device) {
  if (mode_of(precision).grad_scaler) amp::validate(options.scaler());
  if (uses_master_weights(precision)) {
    auto master = options.master();
    amp::validate(master.dtype(compute_dtype(precision)));
  }
  if (options.weight_update() != amp::WeightUpdate::kNearest && precision != Precision::kBf16Pure)
    throw OptionError("weight_update", Phrase::setting("weight_update", amp::weight_update_name(options.weight_update())) +
                                           " rounds 16-bit weights, which only " + Phrase::setting("precision", "bf16-pure") +
                                           " stores (" + precision_name(precision) + " keeps fp32 weights)");
  check_mode_runs_on(precision, device.is_cpu());
}

Learner& Learner::set_precision(Precision precision, const PrecisionOptions& options) {
  validate_precision(precision, options, device());
  if (!options.keep_fp32().empty() && precision != Precision::kFp32) amp::check_islands(options.keep_fp32(), model_.module());
  to_fp32();
  switch (precision) {
    case Precision::kFp32:
      break;
    case Precision::kFp16: {
      auto fp16 = std::make_shared<amp::MixedPrecision>(c10::ScalarType::Half, options.scaler(),
                                                        options.allow_fp16_emulation());
      fp16->keep_fp32(options.keep_fp32());
      add_cb(fp16);
      break;
    }
    case Precision::kBf16: {
      auto bf16 = std::make_shared<amp::MixedPrecision>(c10::ScalarType::BFloat16);
      bf16->keep_fp32(options.keep_fp32());
      add_cb(bf16);
      break;
    }
    case Precision::kBf16Pure: {
      auto pure = std::make_shared<amp::PureBf16>(options.weight_update(), options.rounding_seed());
      pure->keep_fp32(options.keep_fp32());
      add_cb(pure);
      break;
    }
    case Precision::kFp16Master:
    case Precision::kBf16Master: {
      auto master = options.master();
      master.dtype(compute_dtype(precision)).keep_fp32(options.keep_fp32());
      add_cb(std::make_shared<amp::MasterWeights>(*this, master));
      break;
    }
  }
  return *this;
}

Learner& Learner::set_precision(Precision precision) { return set_precision(precision, PrecisionOptions()); }

Learner& Learner::to_fp16() { return set_precision(Precision::kFp16); }

Learner& Learner::to_fp16(const amp::GradScalerOptions& scaler_options, bool allow_fp16_emulation) {
  return set_precision(Precision::kFp16,
                       PrecisionOptions().scaler(scaler_options).allow_fp16_emulation(allow_fp16_emulation));
}

Learner& Learner::to_bf16() { return set_precision(Precision::kBf16); }

Learner& Learner::to_half() { return to_half(amp::MasterWeightsOptions()); }

Learner& Learner::to_half(const amp::MasterWeightsOptions& options) {
  return set_precision(precision_for(options.dtype(), /*master_weights=*/true), PrecisionOptions().master(options));
}

} // namespace mixtrain
