#include "mixtrain/callbacks/gradient_clip.h"

#include "mixtrain/util/host_read.h"
#include "mixtrain/core/learner.h"

#include <torch/torch.h>

namespace mixtrain::callbacks {

GradientClip::GradientClip(double max_norm) : max_norm_(max_norm) {
  TORCH_CHECK(max_norm > 0, "Invalid clip max_norm: ", max_norm, " (must be > 0)");
  order = 20;
}

// libtorch's clip_grad_norm_ (2-norm), op for op, so the clipped gradients are
// the same; only the norm's read goes through host_read.h, so summary.json's
// host_reads_per_step counts it (it is this step's second read).
void GradientClip::before_step(Learner& learn) {
  std::vector<torch::Tensor> norms, grads;
  for (auto& group : learn.opt().param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) {
        grads.push_back(p.grad().data());
        norms.push_back(grads.back().norm(2));
      }
  if (grads.empty()) {
    learn.step_info().grad_norm = 0.0;
    return;
  }
  const torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
  const torch::Tensor coef = torch::clamp(max_norm_ / (total + 1e-6), c10::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coef);
  learn.step_info().grad_norm = read_to_host({total}).at(0);
}

} // namespace mixtrain::callbacks
