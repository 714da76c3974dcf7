#pragma once
/// Hyper-parameter schedules (fastai's SchedCos & co) and the one-cycle policy.

#include "mixtrain/core/callback.h"

#include <torch/arg.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace torch::optim { class Optimizer; }

namespace mixtrain {

/// A value as a function of training progress `pos` in [0, 1).
using Schedule = std::function<double(double pos)>;

/// Cosine from `start` to `end`: start + (1 + cos(pi * (1 - pos))) * (end - start) / 2.
Schedule sched_cos(double start, double end);
/// Linear from `start` to `end`.
Schedule sched_lin(double start, double end);
/// Constant `value`.
Schedule sched_const(double value);
/// Chains schedules: the i-th runs over a fraction `pcts[i]` of training (pcts sum to 1).
Schedule combine_scheds(std::vector<double> pcts, std::vector<Schedule> scheds);
/// Cosine start -> middle over `pct`, then middle -> end (fastai's combined_cos).
Schedule combined_cos(double pct, double start, double middle, double end);

/// fit_one_cycle's options, with fastai's defaults.
struct OneCycleOptions {
  /// Fraction of training spent warming up.
  TORCH_ARG(double, pct_start) = 0.25;
  /// Initial lr is lr_max / div.
  TORCH_ARG(double, div) = 25.0;
  /// Final lr is lr_max / div_final.
  TORCH_ARG(double, div_final) = 1e5;
  /// Momentum (beta1 for Adam-style optimizers) at start, middle and end.
  TORCH_ARG(std::vector<double>, moms) = std::vector<double>{0.95, 0.85, 0.95};
};

/// The one-cycle learning-rate schedule for `lr_max`.
Schedule one_cycle_lr(double lr_max, const OneCycleOptions& options = {});
/// The one-cycle momentum schedule.
Schedule one_cycle_mom(const OneCycleOptions& options = {});

/// Sets the learning rate of every param group.
void set_lr(torch::optim::Optimizer& opt, double lr);
/// Learning rate of the last param group (fastai reports hypers[-1]).
double get_lr(const torch::optim::Optimizer& opt);
/// Momentum of the last param group (beta1 for Adam/AdamW, momentum for SGD/RMSprop); NaN without one.
double get_mom(const torch::optim::Optimizer& opt);
/// Sets the momentum of every param group: beta1 for Adam/AdamW, momentum for
/// SGD/RMSprop. Returns false when the optimizer has no momentum hyper-parameter.
bool set_mom(torch::optim::Optimizer& opt, double mom);

/// Sets "lr" and/or "mom" from schedules before each training batch, with
/// pos = train_iter / total_iters (fastai's ParamScheduler).
class ParamScheduler : public Callback {
 public:
  /// One schedule per hyper-parameter, for every parameter group.
  explicit ParamScheduler(const std::map<std::string, Schedule>& scheds);
  /// One schedule per hyper-parameter, or one per parameter group (lr only:
  /// discriminative learning rates, as fastai schedules a slice).
  explicit ParamScheduler(std::map<std::string, std::vector<Schedule>> scheds);
  std::string name() const override { return "ParamScheduler"; }
  void before_batch(Learner& learn) override;

 private:
  std::map<std::string, std::vector<Schedule>> scheds_;
};

} // namespace mixtrain
