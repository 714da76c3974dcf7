// The losses a run names (mixtrain/models/loss.h): cross_entropy, mse and
// bce_with_logits, each checking that the model's output fits its targets in one line.
#include "mixtrain/models/loss.h"

#include "mixtrain/util/option_error.h"

#include <torch/nn/functional/loss.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

namespace {

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

/// "the model's output [64, 10] does not fit the targets [64, 3] for mse".
std::string misfit(const torch::Tensor& pred, const torch::Tensor& target, const char* loss) {
  return "the model's output " + shape_of(pred) + " does not fit the targets " + shape_of(target) + " for " + loss;
}

} // namespace

LossFn cross_entropy() {
  return [](const torch::Tensor& pred, const torch::Tensor& target) {
    TORCH_CHECK(!target.is_floating_point() && !target.is_complex(), "cross_entropy needs integer class targets, got ",
                target.scalar_type(), " targets (for regression use mse, for 0/1 labels bce_with_logits)");
    const auto p = pred.sizes(), t = target.sizes();
    // Sequence outputs [N, T, C] against [N, T]: classes on the last dim.
    if (pred.dim() >= 3 && pred.dim() == target.dim() + 1 && p.slice(0, p.size() - 1) == t)
      return torch::nn::functional::cross_entropy(pred.reshape({-1, pred.size(-1)}), target.reshape({-1}));
    // torch's own layout: [N, C] against [N], [N, C, d...] against [N, d...].
    const bool torch_layout = pred.dim() >= 2 && pred.dim() == target.dim() + 1 && p[0] == t[0] &&
                              p.slice(2) == t.slice(1);
    TORCH_CHECK(torch_layout, misfit(pred, target, "cross_entropy"),
                " (it takes logits [N, C] with targets [N], or [N, T, C] with [N, T])");
    return torch::nn::functional::cross_entropy(pred, target);
  };
}

LossFn mse() {
  return [](const torch::Tensor& pred, const torch::Tensor& target) {
    TORCH_CHECK(target.is_floating_point(), "mse needs float targets, got ", target.scalar_type(),
                " targets (for class labels use cross_entropy)");
    const bool column = pred.dim() == 2 && pred.size(1) == 1 && target.dim() == 1 && pred.size(0) == target.size(0);
    TORCH_CHECK(column || pred.sizes() == target.sizes(), misfit(pred, target, "mse"), " (they need the same shape)");
    return torch::mse_loss(column ? pred.squeeze(1) : pred, target.to(pred.scalar_type()));
  };
}

LossFn bce_with_logits() {
  return [](const torch::Tensor& pred, const torch::Tensor& target) {
    const bool column = pred.dim() == 2 && pred.size(1) == 1 && target.dim() == 1 && pred.size(0) == target.size(0);
    TORCH_CHECK(column || pred.sizes() == target.sizes(), misfit(pred, target, "bce_with_logits"),
                " (they need the same shape)");
    return torch::binary_cross_entropy_with_logits(column ? pred.squeeze(1) : pred, target.to(pred.scalar_type()));
  };
}

const std::vector<std::pair<std::string, LossKind>>& loss_names() {
  static const std::vector<std::pair<std::string, LossKind>> kNames = {{"cross_entropy", LossKind::kCrossEntropy},
                                                                       {"mse", LossKind::kMse},
                                                                       {"bce_with_logits", LossKind::kBceWithLogits},
                                                                       {"model", LossKind::kModel}};
  return kNames;
}

std::string loss_name(LossKind kind) {
  for (const auto& [name, k] : loss_names())
    if (k == kind) return name;
  TORCH_INTERNAL_ASSERT(false, "unknown LossKind ", static_cast<int>(kind));
}

LossKind parse_loss(const std::string& name) {
  std::string choices;
  for (const auto& [n, kind] : loss_names()) {
    if (n == name) return kind;
    choices += (choices.empty() ? "" : ", ") + n;
  }
  throw OptionError("loss", "unknown " + Phrase::name("loss") + " '" + name + "' (choices: " + choices + ")");
}

LossFn loss_for(LossKind kind) {
  switch (kind) {
    case LossKind::kCrossEntropy: return cross_entropy();
    case LossKind::kMse: return mse();
    case LossKind::kBceWithLogits: return bce_with_logits();
    case LossKind::kModel: break;
  }
  TORCH_CHECK(false, "the loss 'model' is the model's own: train it with model_loss(model)");
}

LossFn loss_by_name(const std::string& name) {
  const LossKind kind = parse_loss(name);
  TORCH_CHECK(kind != LossKind::kModel, "Unknown loss '", name, "' (choices: cross_entropy, mse, bce_with_logits; "
              "a model's own loss is model_loss(model))");
  return loss_for(kind);
}

} // namespace mixtrain
