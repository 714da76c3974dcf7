#pragma once
/// The five optimizers libtorch ships, known in one place: their names, their
/// fastai-style settings (`--opt`, `mom`, `sqr_mom`, `eps`, `wd`), the state tensors
/// each keeps per parameter, where their momentum and weight decay live. The Learner's
/// wd_bn_bias, the one-cycle momentum schedule, bf16-pure's state rounding and the
/// doctor's bytes per parameter all ask here.
///
/// Example:
///   auto opt_func = mixtrain::optimizer(mixtrain::OptimizerSettings().kind(mixtrain::OptimizerKind::kSgd).mom(0.9));
///   mixtrain::Learner learn(model, dls, loss, mixtrain::LearnerOptions().opt_func(opt_func));

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain {

/// Builds an optimizer over `params` with learning rate `lr`.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<torch::Tensor>& params, double lr)>;

enum class OptimizerKind { kAdamW, kAdam, kSgd, kRmsprop, kAdagrad };

/// "adamw", "adam", "sgd", "rmsprop", "adagrad".
const char* optimizer_name(OptimizerKind kind);
/// The kind named so, or nullopt.
std::optional<OptimizerKind> parse_optimizer(const std::string& name);
/// Which of the five `opt` is, or nullopt for another optimizer.
std::optional<OptimizerKind> kind_of(const torch::optim::Optimizer& opt);

/// An optimizer's settings in fastai's terms. A value left NaN takes the kind's
/// default (fastai's: Adam/AdamW mom 0.9, sqr_mom 0.99, eps 1e-5, wd 0.01; SGD mom 0,
/// wd 0; RMSprop mom 0, sqr_mom 0.99, eps 1e-8, wd 0; Adagrad eps 1e-10, wd 0).
struct OptimizerSettings {
  /// The same settings with every NaN replaced by the kind's default.
  OptimizerSettings resolved() const;

  TORCH_ARG(OptimizerKind, kind) = OptimizerKind::kAdamW;
  /// Momentum: Adam's beta1, SGD's and RMSprop's momentum (fit_one_cycle schedules it).
  TORCH_ARG(double, mom) = std::numeric_limits<double>::quiet_NaN();
  /// The squared gradients' average: Adam's beta2, RMSprop's alpha.
  TORCH_ARG(double, sqr_mom) = std::numeric_limits<double>::quiet_NaN();
  TORCH_ARG(double, eps) = std::numeric_limits<double>::quiet_NaN();
  /// Weight decay: decoupled for AdamW, added to the gradient for the others.
  TORCH_ARG(double, wd) = std::numeric_limits<double>::quiet_NaN();
};

/// libtorch's options for these settings (NaNs resolved) at learning rate `lr`: AdamWOptions
/// for kAdamW, and so on. What optimizer() builds with, and mixtrain::optim::factory too.
std::unique_ptr<torch::optim::OptimizerOptions> optimizer_options(const OptimizerSettings& settings, double lr);

/// The factory of an optimizer with these settings.
OptimizerFactory optimizer(const OptimizerSettings& settings);

/// The state tensors `opt` keeps per parameter element, from its options: Adam 2 (3
/// with amsgrad), SGD 1 with momentum (else 0), RMSprop 1 (+1 with momentum, +1
/// centered), Adagrad 1; nullopt for another optimizer.
std::optional<int64_t> state_tensors_per_param(const torch::optim::Optimizer& opt);
/// The state tensors of one parameter (some undefined until used), or nullopt for
/// another optimizer's state.
std::optional<std::vector<torch::Tensor*>> state_tensors(torch::optim::OptimizerParamState& state);
/// Where the options keep the momentum fastai schedules (beta1, or momentum); nullptr
/// for Adagrad and other optimizers.
double* momentum_of(torch::optim::OptimizerOptions& options);
/// Sets the options' weight decay to 0; false for an optimizer it does not know.
bool zero_weight_decay(torch::optim::OptimizerOptions& options);

} // namespace mixtrain
