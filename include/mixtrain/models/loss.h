#pragma once
/// The losses a Learner trains on: a function of the prediction and the targets,
/// fastai's defaults by name, each refusing targets that do not fit with one line.

#include <torch/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

/// loss(pred, target) -> scalar tensor.
using LossFn = std::function<torch::Tensor(const torch::Tensor& pred, const torch::Tensor& target)>;
/// Mean cross-entropy over class logits [N, C] and integer targets [N]; also
/// sequences, logits [N, T, C] against targets [N, T] (and torch's [N, C, d...]
/// against [N, d...]). Throws c10::Error naming both shapes when they do not
/// fit, and float targets.
LossFn cross_entropy();
/// Mean squared error; predictions [N, 1] against targets [N] count as [N].
/// Throws c10::Error naming both shapes when they differ, and integer targets.
LossFn mse();
/// Binary cross-entropy on logits (multi-label or binary); integer or bool 0/1
/// targets are read as float. Throws c10::Error naming both shapes when they differ.
LossFn bce_with_logits();
/// The losses a run names.
enum class LossKind {
  kCrossEntropy,   ///< "cross_entropy": classes, and [N, T, C] sequences
  kMse,            ///< "mse": regression
  kBceWithLogits,  ///< "bce_with_logits": binary and multi-label targets
  kModel,          ///< "model": the model computes its own loss (model_loss in mixtrain/models/model.h)
};
/// Every kind with its name, in the order help lists them: the one place a loss
/// name is written.
const std::vector<std::pair<std::string, LossKind>>& loss_names();
/// The kind's name ("cross_entropy").
std::string loss_name(LossKind kind);
/// The kind `name` denotes; throws OptionError("loss") naming the choices.
LossKind parse_loss(const std::string& name);
/// The loss function of `kind`; kModel has none without its model (model_loss),
/// and throws c10::Error saying so.
LossFn loss_for(LossKind kind);
/// The loss named `name` ("cross_entropy", "mse", "bce_with_logits"); throws c10::Error naming the choices.
LossFn loss_by_name(const std::string& name);

} // namespace mixtrain
