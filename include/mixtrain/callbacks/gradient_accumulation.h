#pragma once
/// Gradient accumulation that composes with loss scaling.

#include "mixtrain/core/callback.h"

#include <cstdint>

namespace mixtrain::callbacks {

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
