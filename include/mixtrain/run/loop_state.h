#pragma once
/// A user's own training loop, as the doctor branches from it (Python's
/// `mixtrain.doctor(model, data, optimizer=opt, scaler=..., steps=N)`): the optimizer's
/// param groups and per-parameter state, the optimizer that steps them as the loop did,
/// and that state loaded into a Learner. The doctor itself is run/doctor.h.
#include "mixtrain/core/learner.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mixtrain::run {

/// Where a user's own training loop stands (Python's `mixtrain.doctor(model, data,
/// optimizer=opt, scaler=..., steps=N)`): a torch.optim optimizer's param groups and
/// per-parameter state, by the model's parameter names. The weights are the model's; a
/// GradScaler's scale and settings come as the precision options (init_scale, ...).
struct LoopState {
  struct Group {
    std::vector<std::string> params;  ///< names, as the model's named_parameters() says them
    double lr = 0, weight_decay = 0, eps = 1e-8, beta1 = 0.9, beta2 = 0.999;  ///< Adam, AdamW (eps, betas)
    double momentum = 0, dampening = 0;                                       ///< SGD (momentum: RMSprop too)
    bool nesterov = false, amsgrad = false;
    double alpha = 0.99;                                ///< RMSprop
    bool centered = false;                              ///< RMSprop
    double lr_decay = 0, initial_accumulator_value = 0;  ///< Adagrad
  };
  std::string optimizer;  ///< "adamw", "adam", "sgd", "rmsprop" or "adagrad"
  std::vector<Group> groups;
  /// Per parameter name, its state as torch.optim keeps it: "step", "exp_avg",
  /// "exp_avg_sq", "max_exp_avg_sq" (Adam, AdamW); "momentum_buffer" (SGD); "step",
  /// "square_avg", "momentum_buffer", "grad_avg" (RMSprop); "step", "sum" (Adagrad). A
  /// parameter the optimizer has not stepped yet has none.
  std::map<std::string, std::map<std::string, at::Tensor>> state;
  /// The seed of the loop's stochastic rounding: mixtrain.optim's `seed`, or 0 for a
  /// torch.optim optimizer (from_torch's default: what the doctor's cure hands over).
  uint64_t rounding_seed = 0;
};

/// The optimizer the loop was stepping, with its groups and hyperparameters, over
/// `model`'s parameters (found by name): an OptimizerFactory for LearnerOptions. It is
/// mixtrain's (optim/optimizers.h): torch.optim's update, op for op, which is what the
/// loop runs (libtorch's own Adam differs in a few ulps), and what mixtrain.optim runs
/// after the cure.
OptimizerFactory loop_optimizer(const LoopState& loop, const Model& model);

/// Puts the loop's optimizer state into `learn`'s optimizer (built by loop_optimizer),
/// before any precision is attached: the modes carry it from there as a resume's. With
/// mixtrain.optim's, its Kahan compensations and its count of steps taken go on too.
void load_loop_state(Learner& learn, const LoopState& loop);

/// The largest step count among the loop's parameter states: how far the loop had trained
/// (-1: its optimizer counts none, as SGD).
int64_t loop_step(const LoopState& loop);

} // namespace mixtrain::run
