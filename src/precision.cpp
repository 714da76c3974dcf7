// The precision modes, and the Learner's precision one-liners. This is the one
// place that knows both the Learner and amp's callbacks: the loop itself knows
// nothing about mixed precision, and amp knows the Learner only through the
// callback interface.
#include "mixtrain/precision.h"

#include "mixtrain/amp/master_weights.h"
#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/diagnose/fit_warning.h"
#include "mixtrain/learner.h"


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
  TORCH_CHECK(false, "unsupported precision '", name, "' (available: ", choices, ")");
}

std::vector<Precision> all_precisions() {
  std::vector<Precision> all;
  for (const auto& n : kNames) all.push_back(n.precision);
  return all;
}

bool precision_scales_loss(Precision p) {
  return p == Precision::kFp16 || p == Precision::kFp16Master || p == Precision::kBf16Master;
}

void validate_precision(Precision precision, const PrecisionOptions& options, const torch::Device& device) {
  if (precision == Precision::kFp16) amp::validate(options.scaler());
  if (precision == Precision::kFp16Master || precision == Precision::kBf16Master) {
    auto master = options.master();
    amp::validate(master.dtype(precision == Precision::kFp16Master ? torch::kHalf : torch::kBFloat16));
  }
  TORCH_CHECK(!(precision == Precision::kFp16Master && device.is_cpu()),
              "precision fp16-master needs CUDA (libtorch has no CPU half matmul); use bf16-master, or fp16 "
              "(emulated on CPU)");
}

Learner& Learner::set_precision(Precision precision, const PrecisionOptions& options) {
  validate_precision(precision, options, device());
  to_fp32();
  switch (precision) {
    case Precision::kFp32:
      break;
    case Precision::kFp16:
      add_cb(std::make_shared<amp::MixedPrecision>(c10::ScalarType::Half, options.scaler(),
                                                   options.allow_fp16_emulation()));
      add_cb(std::make_shared<diagnose::FitWarning>());
      break;
    case Precision::kBf16:
      add_cb(std::make_shared<amp::MixedPrecision>(c10::ScalarType::BFloat16));
      break;
    case Precision::kFp16Master:
    case Precision::kBf16Master: {
      auto master = options.master();
      master.dtype(precision == Precision::kFp16Master ? torch::kHalf : torch::kBFloat16);
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
  if (!pc) return Precision::kFp32;
  switch (pc->dtype()) {
    case c10::ScalarType::Half: return pc->master_weights() ? Precision::kFp16Master : Precision::kFp16;
    case c10::ScalarType::BFloat16: return pc->master_weights() ? Precision::kBf16Master : Precision::kBf16;
    default: return Precision::kFp32;  // fp32 with a loss scaler (MixedPrecision(kFloat))
  }
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
  return set_precision(options.dtype() == torch::kHalf ? Precision::kFp16Master : Precision::kBf16Master,
                       PrecisionOptions().master(options));
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
