#pragma once
/// FitWarning: the callback behind the one line a loss-scaled fit ends with when
/// it skipped more than 5% of its steps or its loss scale collapsed (fastai stays
/// silent). The run layer attaches it for fp16 (run::set_precision); core does not.

#include "mixtrain/core/callback.h"

#include <cstddef>
#include <string>

namespace mixtrain {
struct LostUpdateReport;
} // namespace mixtrain

namespace mixtrain::diagnose {

/// The share of lost weight updates (bf16-pure) above which a fit ends with a
/// lost_updates warning, and the doctor looks for that verdict.
constexpr double kLostUpdatesProblem = 0.25;
/// "likely lost_updates: 73% of weight updates rounded away (worst: norm.weight,
/// 100%, never moved); the cheapest cure is ...", or "" below kLostUpdatesProblem.
std::string lost_updates_warning(const LostUpdateReport& lost);

/// Reads the Recorder's rows of this fit after it ends (diagnose::fit_warning) and
/// prints the warning to stderr. Order 55: after the Recorder (50).
class FitWarning : public Callback {
 public:
  FitWarning() { order = 55; }
  std::string name() const override { return "FitWarning"; }
  /// The warning the last fit ended with ("" when there was none).
  const std::string& message() const { return message_; }

  void before_fit(Learner& learn) override;
  void after_fit(Learner& learn) override;

 private:
  size_t first_step_ = 0;  // the Recorder's step count when this fit began
  std::string message_;
};

} // namespace mixtrain::diagnose
