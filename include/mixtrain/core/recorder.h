#pragma once
/// Recorder: per-step and per-epoch training history. It is always attached to a
/// Learner, and unlike fastai's it keeps its history after fit and across fits.

#include "mixtrain/core/callback.h"
#include "mixtrain/core/metrics.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

/// One optimizer step (or attempted step).
struct StepRecord {
  int64_t iter = 0;          ///< running index over every training batch this Recorder saw
  int64_t epoch = 0;         ///< epoch within its fit
  double loss = 0;           ///< the batch loss (unscaled)
  double smooth_loss = 0;    ///< exponentially smoothed, debiased (fastai's beta 0.98)
  double lr = 0;             ///< learning rate of the last param group during the step
  double mom = std::numeric_limits<double>::quiet_NaN();  ///< its momentum (beta1 for Adam); NaN without one
  // Columns filled by mixed-precision callbacks; NaN / false when they are not attached.
  double scale = std::numeric_limits<double>::quiet_NaN();      ///< loss scale used for this step
  bool skipped = false;                                          ///< optimizer step skipped (overflow)
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  ///< unscaled global grad norm
};

/// A column of the step history: its name (steps.csv's header, the key of
/// Python's Result.steps) and its value as a number. step_columns() is the one
/// list, in the order steps.csv and checkpoints keep them.
struct StepColumn {
  const char* name;
  double (*get)(const StepRecord&);
  void (*set)(StepRecord&, double);
  bool blank_when_nan;  ///< steps.csv leaves it empty when it has no value (scale, grad_norm, mom without them)
};
/// iter, epoch, loss, smooth_loss, lr, scale, skipped, grad_norm, mom.
const std::vector<StepColumn>& step_columns();

/// One epoch: the row of fastai's table.
struct EpochRecord {
  int64_t epoch = 0;
  double train_loss = 0;       ///< smoothed training loss at the end of the epoch (as fastai shows)
  double valid_loss = 0;       ///< mean validation loss, weighted by batch size
  std::vector<double> metrics; ///< one per metric, in metric_names() order
  double seconds = 0;          ///< wall time of train + validate
  double train_seconds = 0;    ///< wall time of the training phase alone
  int64_t samples = 0;         ///< training samples seen
  int64_t steps = 0;           ///< training batches run
  int64_t skipped = 0;         ///< of which the optimizer step was skipped
};

/// A column of the epoch history kept in checkpoints, in their order: epoch,
/// train_loss, valid_loss, seconds, train_seconds, samples, steps, skipped (the
/// metrics are kept beside them).
struct EpochColumn {
  const char* name;
  double (*get)(const EpochRecord&);
  void (*set)(EpochRecord&, double);
};
const std::vector<EpochColumn>& epoch_columns();
/// The epoch table as fastai shows it, metrics.csv writes it and Python's
/// Result.epochs holds it: epoch, train_loss, valid_loss, each metric, seconds.
std::vector<std::pair<std::string, double>> epoch_table_row(const EpochRecord& e, const std::vector<std::string>& metric_names);

/// fastai's smoothed loss: an exponential moving average with beta 0.98, debiased by
/// 1 - beta^n over the n losses added (the Recorder's steps and epochs, lr_find's curve).
struct SmoothedLoss {
  static constexpr double kBeta = 0.98;
  double sum = 0;     ///< the moving average before the debiasing
  int64_t count = 0;  ///< losses added since the last reset
  void add(double loss) {
    sum = kBeta * sum + (1 - kBeta) * loss;
    ++count;
  }
  /// The debiased average; NaN before any loss.
  double value() const {
    return count ? sum / (1 - std::pow(kBeta, static_cast<double>(count))) : std::numeric_limits<double>::quiet_NaN();
  }
  void reset() { *this = SmoothedLoss(); }
};

/// Records losses, learning rates and metrics. Order 50, as in fastai.
class Recorder : public Callback {
 public:
  explicit Recorder(std::vector<Metric> metrics = {});
  std::string name() const override { return "Recorder"; }

  /// Epoch rows (fastai's `recorder.values`).
  const std::vector<EpochRecord>& values() const { return epochs_; }
  /// Every training step, skipped ones included.
  const std::vector<StepRecord>& steps() const { return steps_; }
  /// How many of them the loss scaler (or master weights) skipped.
  int64_t skipped_steps() const;
  /// Mutable access to the latest step, for callbacks that add columns (scale, skipped).
  StepRecord& last_step();
  /// Names of the metric columns.
  std::vector<std::string> metric_names() const;
  const std::vector<Metric>& metrics() const { return metrics_; }
  /// Results of the last validation pass: valid_loss followed by the metrics.
  const std::vector<double>& last_validation() const { return last_validation_; }
  /// Forgets all history.
  void clear();
  /// This run goes on from another's state (train --from in another precision, a doctor's
  /// replay): the steps so far are the parent's. The smoothed loss starts again here, and
  /// own_steps() / own_skipped_steps() count from here (summary.json's counts).
  void start_branch();
  /// The first step of this run's own (0 for a run from scratch).
  int64_t branch_step() const { return branch_step_; }
  /// How many of the steps since branch_step() were skipped.
  int64_t own_skipped_steps() const;

  std::string state_key() const override { return "recorder"; }
  void save_state(torch::serialize::OutputArchive& ar) const override;
  void load_state(torch::serialize::InputArchive& ar) override;

  void before_fit(Learner&) override;
  void before_epoch(Learner&) override;
  void before_train(Learner&) override;
  void after_train(Learner&) override;
  void after_batch(Learner&) override;
  void before_validate(Learner&) override;
  void after_validate(Learner&) override;
  void after_epoch(Learner&) override;
  /// An epoch whose validation finished gets its row even when a callback that runs
  /// before the Recorder cancelled the fit in after_epoch.
  void after_fit(Learner&) override;

 private:
  void record_epoch(Learner& learn);
  bool epoch_validated_ = false;  // this epoch's validation ran and its row is not written yet
  std::vector<Metric> metrics_;
  std::vector<StepRecord> steps_;
  std::vector<EpochRecord> epochs_;
  std::vector<double> last_validation_;
  // Smoothed loss state (fastai's AvgSmoothLoss: lerp then debias).
  SmoothedLoss smooth_;
  int64_t branch_step_ = 0;  // steps before it are a parent run's
  // Validation accumulators: sums weighted by batch size.
  double valid_loss_sum_ = 0;
  std::vector<double> metric_sums_;
  int64_t valid_count_ = 0;
  int64_t epoch_steps_ = 0;
  int64_t epoch_skipped_ = 0;
  double epoch_start_ = 0;
  double train_start_ = 0;
  double train_seconds_ = 0;
  int64_t epoch_samples_ = 0;
};

} // namespace mixtrain
