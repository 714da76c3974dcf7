#pragma once
/// is_norm_layer: the one test of "is this a normalization layer", shared by the
/// master-weights mode (norm layers stay fp32), the Learner (fastai's optimizer
/// does not decay them; train_bn keeps them training in frozen groups) and
/// parameter groups. Small on purpose: amp and the Learner include it, not the model zoo.

namespace torch::nn { class Module; }

namespace mixtrain {

/// Whether `module` is a normalization layer: BatchNorm*, LayerNorm, GroupNorm,
/// InstanceNorm*, as libtorch modules or as TorchScript submodules scripted from
/// torch.nn's classes.
bool is_norm_layer(const torch::nn::Module& module);

} // namespace mixtrain
