#include "mixtrain/diagnose/gradient_health.h"

#include "diagnostic_pass.h"

#include "mixtrain/diagnose/overflow_trace.h"
#include "mixtrain/core/learner.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace mixtrain::diagnose {

GradientHealth gradient_health(torch::nn::Module& model, double scale) {
  torch::NoGradGuard no_grad;
  GradientHealth h;
  h.scale = scale;
  int64_t under = 0, over = 0;
  for (const auto& kv : model.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& g = kv.value().grad();
    if (!g.defined()) continue;
    const torch::Tensor a = g.detach().to(torch::kDouble).abs();
    ParamGradHealth p;
    p.name = kv.key();
    p.numel = a.numel();
    const torch::Tensor nonzero = a.ne(0);
    p.nonzero = nonzero.sum().item<int64_t>();
    const torch::Tensor scaled = a * scale;
    // Round-to-nearest flushes values below half the smallest subnormal to zero.
    const int64_t n_under = scaled.lt(kFp16MinSubnormal / 2).logical_and(nonzero).sum().item<int64_t>();
    const int64_t n_over = scaled.gt(kFp16Max).logical_or(torch::isfinite(a).logical_not()).sum().item<int64_t>();
    p.underflow = p.nonzero ? double(n_under) / p.nonzero : 0.0;
    p.overflow = p.nonzero ? double(n_over) / p.nonzero : 0.0;
    p.max_abs = a.numel() ? torch::where(torch::isfinite(a), a, torch::zeros({}, a.options())).max().item<double>() : 0;
    under += n_under;
    over += n_over;
    h.nonzero += p.nonzero;
    h.params.push_back(p);
  }
  h.underflow = h.nonzero ? double(under) / h.nonzero : 0.0;
  h.overflow = h.nonzero ? double(over) / h.nonzero : 0.0;
  std::stable_sort(h.params.begin(), h.params.end(),
                   [](const ParamGradHealth& a, const ParamGradHealth& b) { return a.underflow > b.underflow; });
  return h;
}

GradientHealth measure_gradients(Learner& learn, const data::Batch& batch, double scale) {
  torch::nn::Module& module = learn.model().module();
  const detail::DiagnosticPass pass(module);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> grads;  // (param, its gradient before)
  for (auto& p : module.parameters(/*recurse=*/true)) {
    grads.emplace_back(p, p.grad().defined() ? p.grad().clone() : torch::Tensor());
    p.mutable_grad() = torch::Tensor();
  }
  const torch::Device device = learn.device();
  const data::Batch b = batch.to(device);
  torch::Tensor pred = learn.model().forward(learn.model().inputs_for(b));
  if (pred.is_floating_point()) pred = pred.to(torch::kFloat);
  learn.loss_fn()(pred, b.y).backward();
  GradientHealth h = gradient_health(module, scale);

  torch::NoGradGuard no_grad;
  for (auto& [p, g] : grads) p.mutable_grad() = g;
  return h;
}

double largest_gradient(const GradientHealth& health) {
  double largest = 0;
  for (const auto& p : health.params) largest = std::max(largest, p.max_abs);
  return largest;
}

double roomy_scale(const GradientHealth& health, double fallback) {
  const double largest = largest_gradient(health);
  if (!std::isfinite(largest) || largest <= 0) return fallback;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(kFp16Max / largest))) - 1);
}

} // namespace mixtrain::diagnose
