#include "mixtrain/amp/loss_scale_rule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace mixtrain::amp {

LossScaleRule::LossScaleRule(double init_scale, LossScaleRuleOptions options)
    : options_(options), scale_(as_float(init_scale)), hysteresis_left_(options.hysteresis) {}

void LossScaleRule::update(bool overflow) {
  const auto& o = options_;
  if (overflow) {
    growth_tracker_ = 0;
    if (--hysteresis_left_ > 0) return;  // tolerated (hysteresis > 1 only)
    hysteresis_left_ = 0;
    // Compared as stored: the scale is a float, so min_scale is rounded the same way.
    const bool at_floor = o.min_scale > 0 && scale_ <= as_float(o.min_scale);
    TORCH_CHECK(!(at_floor && o.throw_at_min_scale), "GradScaler: gradients still overflow at min_scale ",
                o.min_scale, "; the model is not fp16-safe at this learning rate (lower it, clip gradients, or "
                "use bf16/fp32)");
    if (!at_floor) scale_ = as_float(std::max(scale_ * o.backoff_factor, o.min_scale));
    return;
  }
  if (o.consecutive_hysteresis) hysteresis_left_ = o.hysteresis;
  if (++growth_tracker_ >= o.growth_interval) {
    const double grown = as_float(std::min(scale_ * o.growth_factor, o.max_scale));
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
    hysteresis_left_ = o.hysteresis;
  }
}

void LossScaleRule::set_scale(double scale) { scale_ = as_float(scale); }

void LossScaleRule::set_counters(int64_t growth_tracker, int64_t hysteresis_left) {
  growth_tracker_ = growth_tracker;
  hysteresis_left_ = hysteresis_left;
}

} // namespace mixtrain::amp
