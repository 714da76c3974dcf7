#include "mixtrain/callbacks/gradient_accumulation.h"

#include "mixtrain/core/learner.h"

namespace mixtrain::callbacks {

GradientAccumulation::GradientAccumulation(int64_t n) : n_(n) {
  TORCH_CHECK(n >= 1, "Invalid accumulation count: ", n, " (must be >= 1)");
  order = 5;
}

void GradientAccumulation::before_fit(Learner&) { count_ = 0; }

void GradientAccumulation::before_backward(Learner& learn) {
  if (n_ > 1) learn.loss_grad() = learn.loss_grad() / static_cast<double>(n_);
}

void GradientAccumulation::before_step(Learner&) {
  // CancelBatch (not CancelStep) also skips zero_grad, so the gradients add up.
  if (++count_ % n_ != 0) throw CancelBatchException();
}

void GradientAccumulation::after_train(Learner& learn) {
  if (count_ % n_ != 0) {
    // A partial accumulation at the epoch's end must not leak into the next epoch.
    // The optimizer's parameters may not be the model's (fp32 master weights hold
    // the optimizer, the model holds the accumulated gradients): clear both.
    learn.opt().zero_grad();
    for (auto& p : learn.model().module().parameters()) p.mutable_grad() = torch::Tensor();
  }
  count_ = 0;
}

} // namespace mixtrain::callbacks
