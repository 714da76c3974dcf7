#pragma once
/// FitWarning: the callback behind the one line a loss-scaled fit ends with when
/// it skipped more than 5% of its steps or its loss scale collapsed (fastai stays
/// silent), or a quarter or more of its bf16 updates rounded away. The run layer attaches it for the modes
/// whose row says fit_warning, fp16 and bf16-pure (run::add_fit_warning); core does not.
///
/// Where the fit's evidence meets a verdict's rule, the line is that verdict: the fit is
/// judged as a watched loop is (diagnose::judge_watch, the rule of mixtrain.watch and
/// diagnose::Watch), from its scale history and its exact lost-update counts, and names
/// the cure to try first. Below a verdict, the facts above (a skip rate over 5%, a quarter
/// of the updates lost) are said as facts, with the doctor that judges them.

#include "mixtrain/core/callback.h"
#include "mixtrain/util/phrase.h"

#include <cstddef>
#include <string>
#include <vector>

namespace mixtrain {
struct LostUpdateReport;
struct StepRecord;
class PrecisionCallback;
} // namespace mixtrain

namespace mixtrain::diagnose {

/// The share of lost weight updates (bf16-pure) above which a fit ends with a
/// lost_updates warning, and the doctor looks for that verdict.
constexpr double kLostUpdatesProblem = 0.25;
/// "73% of weight updates rounded away in bf16 (worst: norm.weight, 100%, never moved);
/// whether that costs accuracy, the doctor tells ...; the cheapest cure is ...", or empty
/// below kLostUpdatesProblem. A fact, not a verdict: the doctor judges it against fp32.
Phrase lost_updates_warning(const LostUpdateReport& lost);

struct WatchEvidence;
struct WatchReport;
/// A fit's steps as a watch records a loop, for judge_watch: the scale before the first step
/// and after each update (the next step's; after the last, the scaler's own), and each 16-bit
/// parameter's lost updates (`precision` may be null: neither).
WatchEvidence fit_evidence(const std::vector<StepRecord>& steps, const PrecisionCallback* precision);
/// "gradient_overflow: EVIDENCE; the cure to try first: CURE; DOCTOR proves it ...", or empty
/// when the verdict is healthy.
Phrase verdict_warning(const WatchReport& judged);

/// Reads the Recorder's rows of this fit after it ends (diagnose::fit_warning) and
/// says the warning through mixtrain::warn (util/warnings.h: stderr, or the front
/// end's sink). Order 55: after the Recorder (50).
class FitWarning : public Callback {
 public:
  FitWarning() { order = 55; }
  std::string name() const override { return "FitWarning"; }
  /// The warning the last fit ended with (empty when there was none).
  const Phrase& message() const { return message_; }

  void before_fit(Learner& learn) override;
  void after_fit(Learner& learn) override;

 private:
  size_t first_step_ = 0;  // the Recorder's step count when this fit began
  Phrase message_;
};

} // namespace mixtrain::diagnose
