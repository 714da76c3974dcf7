#include "mixtrain/metrics.h"

#include <ATen/ATen.h>

namespace mixtrain {

namespace {
torch::Tensor accuracy_value(const torch::Tensor& pred, const torch::Tensor& target) {
  return pred.argmax(-1).eq(target).to(at::kFloat).mean();
}
} // namespace

Metric accuracy() { return {"accuracy", accuracy_value}; }

Metric error_rate() {
  return {"error_rate", [](const torch::Tensor& p, const torch::Tensor& y) { return 1 - accuracy_value(p, y); }};
}

} // namespace mixtrain
