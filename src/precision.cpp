// The precision modes, and the Learner's precision one-liners. This is the one
// place that knows both the Learner and amp's callbacks: the loop itself knows
// nothing about mixed precision, and amp knows the Learner only through the
// callback interface.
#include "mixtrain/precision.h"

#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/amp/master_weights.h"
#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/diagnose/fit_warning.h"
#include "mixtrain/learner.h"
#include "mixtrain/option_error.h"


namespace mixtrain {

namespace {
struct NamedPrecision {
  Precision precision;
  const char* name;
};
constexpr NamedPrecision kNames[] = {{Precision::kFp32, "fp32"},
                                     {Precision::kFp16, "fp16"},
                                     {Precision::kBf16, "bf16"},
                                     {Precision::kFp16Master, "fp16-master"},
                                     {Precision::kBf16Master, "bf16-master"}};
} // namespace

std::string precision_name(Precision precision) {
  for (const auto& n : kNames)
    if (n.precision == precision) return n.name;
  TORCH_INTERNAL_ASSERT(false, "unknown Precision ", static_cast<int>(precision));
}

Precision parse_precision(const std::string& name) {
  std::string choices;
  for (const auto& n : kNames) {
    if (name == n.name) return n.precision;
    choices += (choices.empty() ? "" : ", ") + std::string(n.name);
  }
  throw OptionError("precision", "unsupported precision '" + name + "' (available: " + choices + ")");
}

std::vector<Precision> all_precisions() {
  std::vector<Precision> all;
  for (const auto& n : kNames) all.push_back(n.precision);
  return all;
}

bool precision_scales_loss(Precision p) {
  return p == Precision::kFp16 || p == Precision::kFp16Master || p == Precision::kBf16Master;
}

c10::ScalarType compute_dtype(Precision p) {
  switch (p) {
    case Precision::kFp32: return c10::ScalarType::Float;
    case Precision::kFp16:
    case Precision::kFp16Master: return c10::ScalarType::Half;
    case Precision::kBf16:
    case Precision::kBf16Master: return c10::ScalarType::BFloat16;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown Precision ", static_cast<int>(p));
}

bool uses_master_weights(Precision p) { return p == Precision::kFp16Master || p == Precision::kBf16Master; }

Precision precision_for(c10::ScalarType dtype, bool master_weights) {
  if (dtype == c10::ScalarType::Half) return master_weights ? Precision::kFp16Master : Precision::kFp16;
  if (dtype == c10::ScalarType::BFloat16) return master_weights ? Precision::kBf16Master : Precision::kBf16;
  return Precision::kFp32;
}

void validate_precision(Precision precision, const PrecisionOptions& options, const torch::Device& device) {
  if (precision == Precision::kFp16) amp::validate(options.scaler());
  if (uses_master_weights(precision)) {
    auto master = options.master();
    amp::validate(master.dtype(compute_dtype(precision)));
  }
  if (precision == Precision::kFp16Master && device.is_cpu())
    throw OptionError("precision", Phrase::name("precision") + " fp16-master needs CUDA (libtorch has no CPU half matmul); use " +
                                       Phrase::setting("precision", "bf16-master") + ", or " +
                                       Phrase::setting("precision", "fp16") + " (emulated on CPU)");
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
      add_cb(std::make_shared<diagnose::FitWarning>());
      break;
    }
    case Precision::kBf16: {
      auto bf16 = std::make_shared<amp::MixedPrecision>(c10::ScalarType::BFloat16);
      bf16->keep_fp32(options.keep_fp32());
      add_cb(bf16);
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

Precision Learner::precision() const {
  // Read from the attached callback, so a callback added by hand counts too.
  const auto pc = precision_cb();
  // fp32 with a loss scaler (MixedPrecision(kFloat)) is fp32.
  return pc ? precision_for(pc->dtype(), pc->master_weights()) : Precision::kFp32;
}

std::shared_ptr<amp::PrecisionCallback> Learner::precision_cb() const { return get_cb<amp::PrecisionCallback>(); }

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

Learner& Learner::to_fp32() {
  while (auto pc = precision_cb()) {
    pc->detach(*this);
    remove_cb(pc);
  }
  while (auto warning = get_cb<diagnose::FitWarning>()) remove_cb(warning);
  return *this;
}

} // namespace mixtrain
