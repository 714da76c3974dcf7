#pragma once
/// LossScaleRule: the one dynamic loss-scale update rule, shared by GradScaler
/// (torch's semantics) and MasterWeights (fastai v1's max_noskip / max_scale).

#include <cstdint>
#include <limits>

namespace mixtrain::amp {

/// The default initial loss scale, 2^16: torch's GradScaler and fastai v1's dynamic
/// scaling both start here. The one place the number is written.
constexpr double kDefaultInitScale = 65536.0;

/// The rule's parameters. The defaults are torch's GradScaler.
struct LossScaleRuleOptions {
  double growth_factor = 2.0;     ///< multiplier after growth_interval clean steps (> 1)
  double backoff_factor = 0.5;    ///< multiplier on an overflow (in (0, 1))
  int64_t growth_interval = 2000; ///< clean steps before growing (>= 1)
  /// The scale never backs off below this (0: no floor).
  double min_scale = 0.0;
  /// An overflow at min_scale (when min_scale > 0) throws instead of being tolerated:
  /// GradScaler's extra. fastai v1 (MasterWeights) tolerates it: false.
  bool throw_at_min_scale = true;
  /// Growth never exceeds this.
  double max_scale = std::numeric_limits<double>::infinity();
  /// Back off only after this many overflowing steps (Megatron/DeepSpeed); 1: torch.
  int64_t hysteresis = 1;
  /// When the hysteresis budget refills. false (Megatron's DynamicGradScaler and
  /// DeepSpeed's default, consecutive_hysteresis=False): only when the scale grows,
  /// so overflows need not be consecutive to spend it. true (DeepSpeed's
  /// consecutive_hysteresis=True): on every clean step, so only overflows in a row count.
  bool consecutive_hysteresis = false;
};

/// The scale and its two counters. Every value is rounded to float32, as torch
/// keeps the scale in a float tensor.
///
/// update(overflow):
/// - overflow: the growth counter resets; the hysteresis budget shrinks by one and,
///   when it is spent, the scale is multiplied by backoff_factor (not below min_scale);
/// - clean step: after growth_interval clean steps in a row the scale is multiplied by
///   growth_factor (not above max_scale, and only to a finite value) and the counter
///   restarts; the hysteresis budget refills then (or on every clean step with
///   consecutive_hysteresis).
///
/// fastai v1's rule is this rule with growth_factor 2, backoff_factor 0.5,
/// growth_interval max_noskip, max_scale, and min_scale 1 without throwing (v1 halves
/// only while the scale is above 1).
class LossScaleRule {
 public:
  explicit LossScaleRule(double init_scale, LossScaleRuleOptions options = {});

  /// Applies one step's outcome. Throws c10::Error at min_scale when the options say so.
  void update(bool overflow);
  /// Sets the scale (rounded to float); the counters are kept.
  void set_scale(double scale);

  double scale() const { return scale_; }
  /// Clean steps counted toward the next growth.
  int64_t growth_tracker() const { return growth_tracker_; }
  /// Overflows still tolerated before the next back-off.
  int64_t hysteresis_left() const { return hysteresis_left_; }
  void set_counters(int64_t growth_tracker, int64_t hysteresis_left);
  const LossScaleRuleOptions& options() const { return options_; }

  /// The value as torch stores it: rounded to float32.
  static double as_float(double v) { return static_cast<double>(static_cast<float>(v)); }

 private:
  LossScaleRuleOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_left_;
};

} // namespace mixtrain::amp
