#pragma once
/// fastai's learning-rate finder: an exponential sweep of the learning rate over
/// a few training steps, the loss against it, and suggestions read off the curve.
/// Learner::lr_find runs it and leaves the Learner exactly as it was.

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain {

struct LrFindOptions {
  /// The fewest steps a sweep reads a curve from. The suggestions read the sweep without its last 5 steps (fastai's trim) and need
  /// two points: fewer steps would give nan suggestions, not a sweep.
  static constexpr int64_t kMinSteps = 7;
  /// First learning rate (> 0).
  TORCH_ARG(double, start_lr) = 1e-7;
  /// Last learning rate (above start_lr).
  TORCH_ARG(double, end_lr) = 10.0;
  /// Training steps of the sweep. With fewer batches per epoch, the training
  /// loader is cycled (several epochs), as fastai does; LrFindResult::epochs says so.
  TORCH_ARG(int64_t, num_it) = 100;  // >= kMinSteps
  /// Stop when the smoothed loss exceeds 4x its minimum (or the loss is inf/NaN).
  TORCH_ARG(bool, stop_div) = true;
};

struct LrFindResult {
  std::vector<double> lrs;            ///< learning rate of each step
  std::vector<double> losses;         ///< each step's loss
  std::vector<double> smooth_losses;  ///< smoothed (fastai's beta 0.98, debiased) over finite losses; NaN before any
  std::vector<bool> skipped;          ///< the loss scaler skipped the step (fp16): visible, never smoothed in when non-finite
  /// fastai's suggestions (NaN when the curve is too short to read).
  double valley = 0;   ///< the longest valley's point a third of the way down plus a sixth
  double steep = 0;    ///< where the loss falls fastest
  double minimum = 0;  ///< the minimum's lr / 10
  int64_t epochs = 0;  ///< epochs the sweep ran (> 1: the loader was cycled)
  bool diverged = false;  ///< stopped early: the loss ran away (the usual end of a sweep)
  /// "valley 1.2e-03, steep 3.3e-03, minimum/10 5.2e-03".
  std::string summary() const;
  /// steps.csv-style rows: step, lr, loss, smooth_loss, skipped.
  std::string csv() const;
  /// The curve (smoothed loss against lr on a log axis), the suggestions marked, skipped steps in red.
  std::string svg() const;
};

/// Throws OptionError naming the first option the sweep cannot use (start_lr,
/// end_lr, num_it): the one check Learner::lr_find and the run layer share.
void validate(const LrFindOptions& options);

/// fastai's suggestion functions on a (lrs, smoothed losses) curve, as lr_find
/// applies them to the curve without its first num_it/10 and last 5 points.
double suggest_valley(const std::vector<double>& lrs, const std::vector<double>& losses);
double suggest_steep(const std::vector<double>& lrs, const std::vector<double>& losses);
double suggest_minimum(const std::vector<double>& lrs, const std::vector<double>& losses);

} // namespace mixtrain
