#pragma once
/// Gradient-norm clipping that composes with loss scaling.

#include "mixtrain/callback.h"

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

/// Accumulates gradients over `n` batches and steps once (fastai's
/// GradientAccumulation, counted in batches). The loss is divided by n, so the
/// step sees the mean gradient. Order 5: it cancels the intermediate batches'
/// steps before MixedPrecision (10) unscales, so the scaler steps and updates
/// only on the boundary. A partial accumulation left at the end of an epoch is
/// discarded.
class GradientAccumulation : public Callback {
 public:
  explicit GradientAccumulation(int64_t n);
  std::string name() const override { return "GradientAccumulation"; }
  void before_fit(Learner& learn) override;
  void before_backward(Learner& learn) override;
  void before_step(Learner& learn) override;
  void after_train(Learner& learn) override;

 private:
  int64_t n_;
  int64_t count_ = 0;
};

} // namespace mixtrain::callbacks
