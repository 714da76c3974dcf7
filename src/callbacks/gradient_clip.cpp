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

} // namespace mixtrain::callbacks
