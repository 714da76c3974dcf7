// The precision modes' names, and what the Learner reads of its precision
// callback. Attaching one is amp's (src/amp/precision_modes.cpp).
#include "mixtrain/core/precision.h"
#include "mixtrain/core/precision_modes.h"

#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/util/option_error.h"


namespace mixtrain {

const std::vector<PrecisionMode>& precision_modes() {
  using c10::ScalarType;
  //                                                          compute               scales master pure  doctor warn  islands
  static const std::vector<PrecisionMode> kModes = {
      {Precision::kFp32, "fp32", ScalarType::Float, false, false, false, false, false, false},
      {Precision::kFp16, "fp16", ScalarType::Half, true, false, false, true, true, true},
      {Precision::kBf16, "bf16", ScalarType::BFloat16, false, false, false, true, false, true},
      {Precision::kFp16Master, "fp16-master", ScalarType::Half, true, true, false, false, false, true},
      {Precision::kBf16Master, "bf16-master", ScalarType::BFloat16, true, true, false, false, false, true},
      {Precision::kBf16Pure, "bf16-pure", ScalarType::BFloat16, false, false, true, true, true, true},
  };
  return kModes;
}

const PrecisionMode& mode_of(Precision precision) {
  for (const auto& m : precision_modes())
    if (m.precision == precision) return m;
  TORCH_INTERNAL_ASSERT(false, "unknown Precision ", static_cast<int>(precision));
}

std::vector<Precision> modes_where(bool PrecisionMode::*flag) {
  std::vector<Precision> out;
  for (const auto& m : precision_modes())
    if (m.*flag) out.push_back(m.precision);
  return out;
}

std::string precision_name(Precision precision) { return mode_of(precision).name; }

Precision parse_precision(const std::string& name) {
  std::string choices;
  for (const auto& m : precision_modes()) {
    if (name == m.name) return m.precision;
    choices += (choices.empty() ? "" : ", ") + std::string(m.name);
  }
  throw OptionError("precision", "unsupported precision '" + name + "' (available: " + choices + ")");
}

std::vector<Precision> all_precisions() {
  std::vector<Precision> all;
  for (const auto& m : precision_modes()) all.push_back(m.precision);
  return all;
}

bool precision_scales_loss(Precision p) { return mode_of(p).scales_loss; }

c10::ScalarType compute_dtype(Precision p) { return mode_of(p).compute; }

bool uses_master_weights(Precision p) { return mode_of(p).master_weights; }

Precision precision_for(c10::ScalarType dtype, bool master_weights, bool pure) {
  // fp32 with a loss scaler (MixedPrecision(kFloat)) is fp32; `pure` counts where a mode has it (bf16 only).
  for (const bool p : {pure && !master_weights, false})
    for (const auto& m : precision_modes())
      if (m.compute == dtype && m.master_weights == master_weights && m.pure == p) return m.precision;
  return Precision::kFp32;
}

Precision Learner::precision() const {
  // Read from the attached callback, so a callback added by hand counts too.
  const auto pc = precision_cb();
  return pc ? pc->precision() : Precision::kFp32;
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
