#pragma once
/// mixtrain's optimizers for a hand-written libtorch loop: torch::optim's AdamW, Adam,
/// SGD, RMSprop and Adagrad (each derives from torch's own class, with its options and
/// state types), stepping through the optimizer core (optim/update_rule.h):
///   - parameters and state in any floating dtype: a bf16 model's moments are bf16, so
///     AdamW holds 8 bytes a parameter (weight 2, gradient 2, state 4);
///   - each update computed in fp32 from those values and written back once by a rule:
///     nearest, stochastic (seeded; no extra memory) or Kahan (a bf16 compensation
///     per parameter, 2 bytes more);
///   - the element updates rounding threw away counted in the same pass (lost_updates()).
///
/// The update is torch.optim's (Python's) single-tensor arithmetic with a correctly rounded
/// root (optim/update_rule.h says why); libtorch's own C++ optimizers differ from it in a
/// few ops (Adam's first moment is mul_/add_ there, lerp_ in Python), so in fp32 these are
/// within a few ulps of Python's torch.optim and of libtorch's, and SGD (no root) is bitwise
/// both. As torch's classes, they serve wherever a torch::optim::Optimizer
/// does: amp::GradScaler::step, param groups, LR changes through the options, the
/// Learner's opt_func, save/load (torch's layout, then the rounding's own state).
///
/// Example (a bf16 model in a plain loop; examples/bf16_own_loop):
///   model->to(torch::kBFloat16);
///   mixtrain::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4),
///                              mixtrain::optim::Rounding().weight_update(mixtrain::amp::WeightUpdate::kStochastic));
///   loss.backward(); opt.step(); opt.zero_grad();

#include "mixtrain/amp/weight_update.h"
#include "mixtrain/core/optimizers.h"

#include <torch/arg.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace mixtrain::optim {

/// How the optimizer writes a 16-bit weight back.
struct Rounding {
  TORCH_ARG(amp::WeightUpdate, weight_update) = amp::WeightUpdate::kNearest;
  /// Seeds stochastic rounding, with the step and the parameter's index.
  TORCH_ARG(uint64_t, seed) = 0;
};

/// What the five share: the rounding, its per-parameter state and counts.
class RoundedSteps {
 public:
  const Rounding& rounding() const { return rounding_; }
  /// The element updates lost to rounding since the last call, over every parameter,
  /// and restarts the count (an fp32 parameter loses none: it is not rounded).
  amp::LostUpdates lost_updates();
  /// The same per parameter, in parameters() order, without restarting the count.
  const std::vector<amp::LostUpdates>& lost_updates_per_param() const { return lost_; }
  /// step() calls so far: with the parameter's index, the stochastic stream.
  int64_t steps_taken() const { return steps_; }
  /// The counts per parameter (parameters() order) since the last call, restarting them:
  /// bf16-pure's Learner reads each step's here.
  std::vector<amp::LostUpdates> take_lost_updates_per_param();

  /// Changes the rule: bf16-pure gives the Learner's optimizer its own.
  void set_rounding(Rounding rounding) { rounding_ = rounding; }
  /// Continues the step count from `steps` (a branch of a training loop whose optimizer
  /// had taken them): the next step's stochastic stream is the one the loop's would be.
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  /// `param`'s Kahan compensation (undefined while it has none), and setting it (a
  /// checkpoint that kept it elsewhere).
  torch::Tensor compensation(const torch::Tensor& param) const;
  void set_compensation(const torch::Tensor& param, torch::Tensor compensation);

 protected:
  explicit RoundedSteps(Rounding rounding) : rounding_(rounding) {}
  /// The step of every parameter of `self` that has a gradient.
  torch::Tensor rounded_step(torch::optim::Optimizer& self, const torch::optim::Optimizer::LossClosure& closure);
  /// The rounding's state after torch's: the step count and the Kahan compensations.
  void save_rounding(const torch::optim::Optimizer& self, torch::serialize::OutputArchive& archive) const;
  void load_rounding(const torch::optim::Optimizer& self, torch::serialize::InputArchive& archive);

 private:
  Rounding rounding_;
  int64_t steps_ = 0;
  std::unordered_map<const void*, torch::Tensor> compensation_;  // by parameter (kahan, bf16 weights)
  std::vector<amp::LostUpdates> lost_;
};

/// One of torch's five with the core's step: its options and state types, its save/load
/// followed by the rounding's state.
template <typename TorchOptimizer, typename Options>
class Rounded : public TorchOptimizer, public RoundedSteps {
 public:
  explicit Rounded(const std::vector<torch::optim::OptimizerParamGroup>& groups, Options defaults = {},
                   Rounding rounding = {})
      : TorchOptimizer(groups, std::move(defaults)), RoundedSteps(rounding) {}
  explicit Rounded(std::vector<torch::Tensor> params, Options defaults = {}, Rounding rounding = {})
      : TorchOptimizer(std::move(params), std::move(defaults)), RoundedSteps(rounding) {}
  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    return rounded_step(*this, closure);
  }
  void save(torch::serialize::OutputArchive& archive) const override {
    TorchOptimizer::save(archive);
    save_rounding(*this, archive);
  }
  void load(torch::serialize::InputArchive& archive) override {
    TorchOptimizer::load(archive);
    load_rounding(*this, archive);
  }
};

using AdamW = Rounded<torch::optim::AdamW, torch::optim::AdamWOptions>;
using Adam = Rounded<torch::optim::Adam, torch::optim::AdamOptions>;
using SGD = Rounded<torch::optim::SGD, torch::optim::SGDOptions>;  // SGDOptions has no default: give the lr
using RMSprop = Rounded<torch::optim::RMSprop, torch::optim::RMSpropOptions>;
using Adagrad = Rounded<torch::optim::Adagrad, torch::optim::AdagradOptions>;

/// mixtrain::optimizer(settings)'s factory with these classes in place of libtorch's: the
/// same options, torch.optim's update (the run layer's Learners use it: the CLI, Python's
/// train and doctor). Rounding applies to 16-bit parameters only, so a Learner's fp32
/// storage (bf16-pure included: it rounds after the step) is stepped as torch.optim steps it.
OptimizerFactory factory(const OptimizerSettings& settings, Rounding rounding = {});

} // namespace mixtrain::optim
