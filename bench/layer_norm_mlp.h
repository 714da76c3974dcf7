#pragma once
// The benchmarks' model with LayerNorms: `layers` x (Linear -> LayerNorm -> ReLU), then a
// Linear head; the shape bf16-pure loses updates on (the norm gains start at exactly 1.0).
#include <torch/torch.h>

#include <string>
#include <vector>

struct LayerNormMlpImpl : torch::nn::Module {
  LayerNormMlpImpl(int64_t in, int64_t width, int layers, int64_t classes) {
    for (int i = 0; i < layers; ++i) {
      fc.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(i == 0 ? in : width, width)));
      ln.push_back(register_module("ln" + std::to_string(i), torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}))));
    }
    head = register_module("head", torch::nn::Linear(width, classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < fc.size(); ++i) x = torch::relu(ln[i](fc[i](x)));
    return head(x);
  }
  std::vector<torch::nn::Linear> fc;
  std::vector<torch::nn::LayerNorm> ln;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(LayerNormMlp);
