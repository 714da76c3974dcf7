#include "mixtrain/models.h"

#include <torch/nn.h>

namespace mixtrain {

bool is_norm_layer(const torch::nn::Module& m) {
  namespace nn = torch::nn;
  return dynamic_cast<const nn::BatchNorm1dImpl*>(&m) || dynamic_cast<const nn::BatchNorm2dImpl*>(&m) ||
         dynamic_cast<const nn::BatchNorm3dImpl*>(&m) || dynamic_cast<const nn::LayerNormImpl*>(&m) ||
         dynamic_cast<const nn::GroupNormImpl*>(&m) || dynamic_cast<const nn::InstanceNorm1dImpl*>(&m) ||
         dynamic_cast<const nn::InstanceNorm2dImpl*>(&m) || dynamic_cast<const nn::InstanceNorm3dImpl*>(&m);
}

} // namespace mixtrain

namespace mixtrain::models {

namespace nn = torch::nn;

torch::nn::Sequential simple_cnn() {
  return nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(1, 16, 3).stride(2).padding(1).bias(false)), nn::BatchNorm2d(16), nn::ReLU(),
      nn::Conv2d(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1).bias(false)), nn::BatchNorm2d(32), nn::ReLU(),
      nn::Flatten(), nn::Linear(32 * 7 * 7, 10));
}

torch::nn::Sequential mlp() {
  return nn::Sequential(nn::Flatten(), nn::Linear(28 * 28, 256), nn::ReLU(), nn::Linear(256, 10));
}

torch::nn::Sequential by_name(const std::string& name) {
  if (name == "cnn") return simple_cnn();
  if (name == "mlp") return mlp();
  TORCH_CHECK(false, "Unknown model '", name, "' (choices: cnn, mlp)");
}

} // namespace mixtrain::models
