#include "mixtrain/core/metrics.h"

#include <ATen/ATen.h>

#include <cmath>

namespace mixtrain {

namespace {
torch::Tensor accuracy_value(const torch::Tensor& pred, const torch::Tensor& target) {
  return pred.argmax(-1).eq(target).to(at::kFloat).mean();
}
} // namespace

Metric accuracy() { return {"accuracy", accuracy_value}; }

Metric binary_accuracy() {
  return {"accuracy", [](const torch::Tensor& p, const torch::Tensor& y) {
            return p.reshape(y.sizes()).gt(0).eq(y.gt(0.5)).to(at::kFloat).mean();
          }};
}

Metric perplexity() {
  return {"perplexity",
          [](const torch::Tensor& p, const torch::Tensor& y) {
            return at::cross_entropy_loss(p.reshape({-1, p.size(-1)}).to(at::kFloat), y.reshape({-1}));
          },
          [](double mean_loss) { return std::exp(mean_loss); }};
}

Metric error_rate() {
  return {"error_rate", [](const torch::Tensor& p, const torch::Tensor& y) { return 1 - accuracy_value(p, y); }};
}

} // namespace mixtrain
