#pragma once
/// The small reference models used by the CLI, the demo and the benchmarks.

#include <torch/nn/modules/container/sequential.h>

#include <string>

namespace torch::nn { class Module; }

namespace mixtrain {

/// Whether `module` is a normalization layer (BatchNorm*, LayerNorm, GroupNorm,
/// InstanceNorm*): master weights keep them in fp32, and fastai's default optimizer
/// does not decay their parameters.
bool is_norm_layer(const torch::nn::Module& module);

} // namespace mixtrain

namespace mixtrain::models {

/// conv(1->16, 3, stride 2, pad 1)+BN+ReLU, conv(16->32, 3, stride 2, pad 1)+BN+ReLU,
/// flatten, linear(1568->10). Convolutions have no bias: BatchNorm follows (fastai's ConvLayer).
torch::nn::Sequential simple_cnn();
/// flatten, linear(784->256), ReLU, linear(256->10).
torch::nn::Sequential mlp();
/// The model named `name` ("cnn" or "mlp"); throws c10::Error naming the choices otherwise.
torch::nn::Sequential by_name(const std::string& name);

} // namespace mixtrain::models
