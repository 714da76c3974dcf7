#include "mixtrain/callbacks/gradient_clip.h"

#include "mixtrain/learner.h"

#include <torch/nn/utils/clip_grad.h>

namespace mixtrain::callbacks {

GradientClip::GradientClip(double max_norm) : max_norm_(max_norm) {
  TORCH_CHECK(max_norm > 0, "Invalid clip max_norm: ", max_norm, " (must be > 0)");
  order = 20;
}

void GradientClip::before_step(Learner& learn) {
  std::vector<torch::Tensor> params;
  for (auto& group : learn.opt().param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) params.push_back(p);
  learn.step_info().grad_norm = torch::nn::utils::clip_grad_norm_(params, max_norm_);
}

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
  if (count_ % n_ != 0) learn.opt().zero_grad();
  count_ = 0;
}

} // namespace mixtrain::callbacks
