#pragma once
/// Gradient-norm clipping that composes with loss scaling.

#include "mixtrain/core/callback.h"

namespace mixtrain::callbacks {

/// Clips the global gradient norm to `max_norm` before each optimizer step and
/// records the norm before clipping in the step's StepInfo (grad_norm column).
/// Order 20: after MixedPrecision (10) has unscaled the gradients, so the clip
/// sees true norms; a step skipped for overflow never reaches it.
class GradientClip : public Callback {
 public:
  explicit GradientClip(double max_norm);
  std::string name() const override { return "GradientClip"; }
  void before_step(Learner& learn) override;

 private:
  double max_norm_;
};

} // namespace mixtrain::callbacks
