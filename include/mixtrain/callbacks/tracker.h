#pragma once
/// fastai's TrackerCallback family: follow a monitored value across epochs,
/// keep the best model (SaveModel), stop when it no longer improves (EarlyStopping).

#include "mixtrain/core/callback.h"

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain {
class Recorder;
}

namespace mixtrain::callbacks {

/// What a TrackerCallback can monitor with `recorder`'s metrics: train_loss,
/// valid_loss, then the metrics' names.
std::vector<std::string> monitorable_values(const Recorder& recorder);
/// "train_loss, valid_loss, accuracy": the choices, for a message.
std::string monitorable_list(const Recorder& recorder);

/// Follows `monitor` ("valid_loss", "train_loss", or a metric's name) after every
/// epoch. As fastai: lower is better for names containing "loss" or "error",
/// higher otherwise; an epoch improves when it beats the best by more than
/// `min_delta`. Order 60: after the Recorder has recorded the epoch. The best
/// value is in checkpoints (resume continues the comparison). before_fit throws
/// c10::Error naming the choices for an unknown monitor.
class TrackerCallback : public Callback {
 public:
  explicit TrackerCallback(std::string monitor = "valid_loss", double min_delta = 0);
  void before_fit(Learner& learn) override;
  void after_epoch(Learner& learn) override;
  const std::string& monitor() const { return monitor_; }
  /// The best value so far (+/-inf before the first epoch).
  double best() const { return best_; }
  /// Epoch (counted across fits, as the Recorder's) of the best value; -1 before any.
  int64_t best_epoch() const { return best_epoch_; }

 protected:
  /// Called after every epoch with whether it improved on the best.
  virtual void on_epoch_tracked(Learner& learn, bool improved) = 0;
  /// Called when a fit starts afresh (not a resumed one): reset what the last fit left.
  virtual void on_fit_start() {}
  void save_tracker(torch::serialize::OutputArchive& ar) const;
  void load_tracker(torch::serialize::InputArchive& ar);

 private:
  std::string monitor_;
  double min_delta_;
  bool lower_is_better_;
  double best_;
  int64_t best_epoch_ = -1;
};

/// Keeps the weights (parameters and buffers) of the best epoch in memory, and
/// with `restore_best` (fastai's default) puts them back in the model when the
/// fit ends, so what is saved afterwards (OUT/model.pt) is the best model.
class SaveModel : public TrackerCallback {
 public:
  explicit SaveModel(std::string monitor = "valid_loss", double min_delta = 0, bool restore_best = true);
  std::string name() const override { return "SaveModel"; }
  std::string state_key() const override { return "save_model"; }
  void save_state(torch::serialize::OutputArchive& ar) const override;
  void load_state(torch::serialize::InputArchive& ar) override;
  void after_fit(Learner& learn) override;
  /// The best epoch's weights (empty before the first epoch).
  const std::vector<torch::Tensor>& best_state() const { return best_state_; }

 protected:
  void on_epoch_tracked(Learner& learn, bool improved) override;
  void on_fit_start() override { best_state_.clear(); }

 private:
  bool restore_best_;
  std::vector<torch::Tensor> best_state_;
};

/// Ends the fit (CancelFitException) once `patience` epochs in a row brought no
/// improvement, saying so in one line on stderr, as fastai. Throws c10::Error for
/// a negative patience.
class EarlyStopping : public TrackerCallback {
 public:
  explicit EarlyStopping(std::string monitor = "valid_loss", double min_delta = 0, int64_t patience = 1);
  std::string name() const override { return "EarlyStopping"; }
  std::string state_key() const override { return "early_stopping"; }
  void save_state(torch::serialize::OutputArchive& ar) const override;
  void load_state(torch::serialize::InputArchive& ar) override;
  /// Whether it stopped the last fit, and at which epoch.
  bool stopped() const { return stopped_epoch_ >= 0; }
  int64_t stopped_epoch() const { return stopped_epoch_; }

 protected:
  void on_epoch_tracked(Learner& learn, bool improved) override;
  void on_fit_start() override { wait_ = 0, stopped_epoch_ = -1; }

 private:
  int64_t patience_;
  int64_t wait_ = 0;
  int64_t stopped_epoch_ = -1;
};

} // namespace mixtrain::callbacks
