#pragma once
// Private: what a diagnostic pass over a model must leave as it found it.

#include <torch/nn/module.h>
#include <torch/torch.h>

#include <utility>
#include <vector>

namespace mixtrain::diagnose::detail {

/// Puts the model in training mode (the mode in which fp16 trouble happens) for
/// the pass and restores its mode and its buffers (BatchNorm running statistics,
/// which a training-mode forward updates) when the pass ends.
class DiagnosticPass {
 public:
  explicit DiagnosticPass(torch::nn::Module& module) : module_(module), was_training_(module.is_training()) {
    for (auto& b : module.buffers(/*recurse=*/true)) buffers_.emplace_back(b, b.clone());
    module.train();
  }
  ~DiagnosticPass() {
    torch::NoGradGuard no_grad;
    for (auto& [live, saved] : buffers_) live.copy_(saved);
    module_.train(was_training_);
  }
  DiagnosticPass(const DiagnosticPass&) = delete;
  DiagnosticPass& operator=(const DiagnosticPass&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers_;
};

} // namespace mixtrain::diagnose::detail
