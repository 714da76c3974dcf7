// The precision modes' names, and what the Learner reads of its precision
// callback. Attaching one is amp's (src/amp/precision_modes.cpp).
#include "mixtrain/core/precision.h"

#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/util/option_error.h"


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
                                     {Precision::kBf16Master, "bf16-master"},
                                     {Precision::kBf16Pure, "bf16-pure"}};
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
    case Precision::kBf16Master:
    case Precision::kBf16Pure: return c10::ScalarType::BFloat16;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown Precision ", static_cast<int>(p));
}

bool uses_master_weights(Precision p) { return p == Precision::kFp16Master || p == Precision::kBf16Master; }

Precision precision_for(c10::ScalarType dtype, bool master_weights, bool pure) {
  if (dtype == c10::ScalarType::Half) return master_weights ? Precision::kFp16Master : Precision::kFp16;
  if (dtype == c10::ScalarType::BFloat16)
    return master_weights ? Precision::kBf16Master : pure ? Precision::kBf16Pure : Precision::kBf16;
  return Precision::kFp32;
}

Precision Learner::precision() const {
  // Read from the attached callback, so a callback added by hand counts too.
  const auto pc = precision_cb();
  // fp32 with a loss scaler (MixedPrecision(kFloat)) is fp32.
  return pc ? precision_for(pc->dtype(), pc->master_weights(), pc->pure_weights()) : Precision::kFp32;
}

std::shared_ptr<PrecisionCallback> Learner::precision_cb() const { return get_cb<PrecisionCallback>(); }

Learner& Learner::to_fp32() {
  while (auto pc = precision_cb()) {
    pc->detach(*this);
    remove_cb(pc);
  }
  return *this;
}

std::string lost_updates_meaning(const std::string& rule) {
  const std::string counted =
      "fraction: the element updates (nonzero in fp32) that left their bf16 weight unchanged in their own step; "
      "norm_ratio: |what that step's rounding changed| / |the updates intended|";
  if (rule == "stochastic")
    return counted + ". Under stochastic rounding none is lost: each rounds up with a probability in proportion to "
                     "its size, so the weight takes it in expectation, and a norm_ratio near 1 is that rounding's "
                     "unbiased noise";
  if (rule == "kahan")
    return counted + ". Under Kahan none is lost: the compensation carries what a step's rounding dropped into the "
                     "next steps";
  return counted + ". Under nearest rounding these updates are lost for good";
}

} // namespace mixtrain
