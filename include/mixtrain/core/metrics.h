#pragma once
/// Metrics: functions of (predictions, targets) averaged over the validation set.

#include <torch/types.h>

#include <functional>
#include <string>

namespace mixtrain {

/// A named metric. `fn` returns the batch mean as a 0-dim tensor; the Recorder
/// averages it over the validation set weighted by batch size (fastai's AvgMetric).
///
/// Example (a user-defined metric):
///   mixtrain::Metric top2{"top2", [](const torch::Tensor& p, const torch::Tensor& y) {
///     return (std::get<1>(p.topk(2)) == y.unsqueeze(1)).any(1).to(torch::kFloat).mean(); }};
struct Metric {
  std::string name;
  std::function<torch::Tensor(const torch::Tensor& pred, const torch::Tensor& target)> fn;
  /// Applied to the average over the validation set (empty: none). Perplexity is
  /// exp(mean loss), not the mean of per-batch perplexities.
  std::function<double(double)> finalize = {};
};

/// Fraction of samples whose argmax prediction equals the target.
Metric accuracy();
/// 1 - accuracy.
Metric error_rate();
/// For binary / multi-label logits: fraction of outputs whose sign matches the 0/1 target.
Metric binary_accuracy();
/// exp(mean cross-entropy) of a language model's logits [N, T, C] against targets [N, T].
Metric perplexity();

} // namespace mixtrain
