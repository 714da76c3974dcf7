#pragma once
/// GradScaler: dynamic loss scaling, a C++ port of torch.amp.GradScaler.
/// It does not depend on Learner: a hand-written libtorch loop can use it alone.
///
/// Example (the torch pattern, with clipping and 4-step accumulation):
///   mixtrain::amp::GradScaler scaler;
///   for (int64_t i = 0; i < steps; ++i) {
///     torch::Tensor loss = loss_fn(model->forward(x[i]), y[i]) / 4;
///     scaler.scale(loss).backward();
///     if ((i + 1) % 4 != 0) continue;         // accumulate: step/update on the boundary only
///     scaler.unscale_(opt);                    // grads are now true values ...
///     torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);  // ... so clipping sees true norms
///     scaler.step(opt);                        // skipped when a grad is inf/NaN
///     scaler.update();
///     opt.zero_grad();
///   }

#include "mixtrain/amp/loss_scale_rule.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <limits>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

namespace torch::optim { class Optimizer; }

namespace mixtrain::amp {

/// GradScaler's options. The defaults reproduce torch exactly; the extras
/// (min_scale, max_scale, hysteresis) are off by default.
struct GradScalerOptions {
  /// Initial loss scale (torch and fastai: 2^16).
  TORCH_ARG(double, init_scale) = kDefaultInitScale;
  /// Scale multiplier after growth_interval clean steps (> 1).
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Scale multiplier on overflow (in (0, 1)).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Consecutive clean steps before growing (>= 1).
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// When false every method is a pass-through (scale 1, step always runs).
  TORCH_ARG(bool, enabled) = true;
  /// Extra: when a back-off would go below this, update() throws (0 = no floor).
  TORCH_ARG(double, min_scale) = 0.0;
  /// Extra: growth never exceeds this (fastai v1 caps at 2^24; default: no cap).
  TORCH_ARG(double, max_scale) = std::numeric_limits<double>::infinity();
  /// Extra (Megatron/DeepSpeed): back off only after this many overflowing steps;
  /// 1 is torch's behaviour. The budget refills when the scale grows (Megatron,
  /// DeepSpeed's default), or on every clean step with consecutive_hysteresis.
  TORCH_ARG(int64_t, hysteresis) = 1;
  /// Extra: refill the hysteresis budget on every clean step (DeepSpeed's
  /// consecutive_hysteresis=True), so only overflows in a row are tolerated.
  TORCH_ARG(bool, consecutive_hysteresis) = false;
};

/// Throws c10::Error naming the first invalid option.
void validate(const GradScalerOptions& options);

/// GradScaler's state_dict: torch's keys (strings) to floats and ints, as torch keeps them.
using GradScalerState = c10::impl::GenericDict;
/// An empty GradScalerState (string keys, any values).
inline GradScalerState empty_grad_scaler_state() { return GradScalerState(c10::StringType::get(), c10::AnyType::get()); }

/// Dynamic loss scaling with torch's semantics:
/// - `scale(loss)` multiplies by the current scale;
/// - `unscale_(opt)` divides opt's grads by the scale in one fused pass and
///   records whether any is inf/NaN; twice before update() is an error;
/// - `step(opt)` unscales if needed and runs opt.step() only when every grad
///   is finite; returns whether it stepped;
/// - `update()` backs off on overflow (tracker reset), otherwise counts clean
///   steps and grows after growth_interval of them.
/// Several optimizers can share one scaler: each skips on its own, and one
/// update() sees an overflow in any of them.
///
/// The scale lives on the gradients' device as in torch. found_inf is read on
/// the host once per step (the skip decision); the scale arithmetic then runs
/// on a host mirror, so get_scale() and update() never synchronize.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  /// loss * scale (loss unchanged when disabled). Creates the scale on loss's device.
  torch::Tensor scale(const torch::Tensor& loss);
  /// Unscales `opt`'s gradients in place and records inf/NaN.
  void unscale_(torch::optim::Optimizer& opt);
  /// Unscales if needed; steps `opt` unless a gradient is inf/NaN. Returns whether it stepped.
  bool step(torch::optim::Optimizer& opt);
  /// The skip decision without stepping: unscales if needed and returns true
  /// when the caller should run opt.step(). Counts as this step's step() (a
  /// callback uses it when the training loop owns the optimizer step).
  bool prepare_step(torch::optim::Optimizer& opt);
  /// prepare_step, reading `also` (one-element tensors: the step's loss) with
  /// found_inf in one device-to-host transfer (mixtrain/host_read.h); their
  /// values go to `values`. With CPU gradients found_inf is known on the host
  /// already and only `also` is read.
  bool prepare_step(torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& also, std::vector<double>& values);
  /// Adjusts the scale from this step's overflows and resets per-optimizer state.
  void update();
  /// Sets the scale explicitly (torch's update(new_scale)); the tracker is kept.
  void update(double new_scale);

  /// Data parallelism: `reduce` turns a one-element float flag (1 = this rank
  /// found inf/NaN) into the maximum over all ranks, so every rank skips the
  /// same steps and keeps the same scale. Called once per optimizer per step.
  void set_found_inf_reducer(std::function<void(torch::Tensor& flag)> reduce) { reduce_found_inf_ = std::move(reduce); }

  /// Current scale (1 when disabled). Never synchronizes.
  double get_scale() const;
  /// Clean steps counted toward the next growth.
  int64_t growth_tracker() const { return rule_.growth_tracker(); }
  /// Whether the last update() saw an overflow.
  bool last_step_overflowed() const { return last_overflow_; }
  bool is_enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }

  /// torch's keys and types: scale, growth_factor, backoff_factor (floats),
  /// growth_interval, _growth_tracker (ints); plus _hysteresis_tracker (int).
  /// Empty when disabled. `torch::pickle_save(c10::IValue(state))` writes it in a
  /// form Python's `torch.load` reads and `torch.cuda.amp.GradScaler().load_state_dict`
  /// takes; `torch::pickle_load` reads what Python's `torch.save(scaler.state_dict())` wrote.
  GradScalerState state_dict() const;
  /// Restores a state_dict() (ours or torch's; ints and floats are both accepted for
  /// every number). A no-op on a disabled scaler, as torch's.
  void load_state_dict(const GradScalerState& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptState {
    Stage stage = Stage::kReady;
    torch::Tensor found_inf;   // on the grads' device
    int found_inf_host = -1;   // -1 until read on the host
  };
  OptState& state_for(torch::optim::Optimizer& opt);
  /// Makes found_inf known on the host, reading it with `also` in one transfer; returns also's values.
  std::vector<double> read_found_inf(OptState& s, const std::vector<torch::Tensor>& also = {});
  void ensure_scale(const torch::Device& device);
  void sync_scale_tensor();

  GradScalerOptions options_;
  std::function<void(torch::Tensor&)> reduce_found_inf_;
  LossScaleRule rule_;       // host mirror of the scale: the truth for every decision
  bool last_overflow_ = false;
  torch::Tensor scale_tensor_;  // on the grads' device, as torch keeps it
  std::unordered_map<const torch::optim::Optimizer*, OptState> per_opt_;
};

} // namespace mixtrain::amp
