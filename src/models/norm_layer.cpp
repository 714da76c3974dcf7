#include "mixtrain/models/norm_layer.h"

#include "mixtrain/models/scripted_model.h"

#include <torch/nn.h>

namespace mixtrain {

namespace {
/// A TorchScript submodule scripted from one of torch.nn's norm classes.
bool is_scripted_norm(const torch::nn::Module& m) {
  const auto* s = dynamic_cast<const ScriptedSubmodule*>(&m);
  if (!s) return false;
  const std::string& c = s->python_class();
  const std::string cls = c.substr(c.rfind('.') + 1);
  return c.rfind("torch.nn.modules.", 0) == 0 &&
         (cls.rfind("BatchNorm", 0) == 0 || cls == "LayerNorm" || cls == "GroupNorm" || cls.rfind("InstanceNorm", 0) == 0);
}
} // namespace

bool is_norm_layer(const torch::nn::Module& m) {
  namespace nn = torch::nn;
  return dynamic_cast<const nn::BatchNorm1dImpl*>(&m) || dynamic_cast<const nn::BatchNorm2dImpl*>(&m) ||
         dynamic_cast<const nn::BatchNorm3dImpl*>(&m) || dynamic_cast<const nn::LayerNormImpl*>(&m) ||
         dynamic_cast<const nn::GroupNormImpl*>(&m) || dynamic_cast<const nn::InstanceNorm1dImpl*>(&m) ||
         dynamic_cast<const nn::InstanceNorm2dImpl*>(&m) || dynamic_cast<const nn::InstanceNorm3dImpl*>(&m) ||
         is_scripted_norm(m);
}

} // namespace mixtrain
