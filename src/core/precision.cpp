// The precision modes' names, and what the Learner reads of its precision
// callback. Attaching one is amp's (src/amp/precision_options.cpp).
#include "mixtrain/core/precision.h"
#include "mixtrain/core/precision_modes.h"

#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/util/option_error.h"


namespace mixtrain {

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

} // namespace mixtrain
