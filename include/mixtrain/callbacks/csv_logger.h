#pragma once
/// CSV logs: one row per epoch (metrics.csv) and one per training step (steps.csv).

#include "mixtrain/core/callback.h"
#include "mixtrain/core/recorder.h"

#include <cstdint>
#include <fstream>
#include <string>

namespace mixtrain::callbacks {

/// Writes `dir/metrics.csv` (epoch, train_loss, valid_loss, metrics..., seconds)
/// and `dir/steps.csv` (iter, epoch, loss, smooth_loss, lr, scale, skipped; scale
/// is empty when no loss scaling was used). Rows are flushed at the end of every
/// epoch and of every fit (an interrupted one too), so a stopped run keeps the
/// steps it did. The files are created at the first fit, starting with the history
/// the Recorder already holds (a resumed run's); later fits on the same logger
/// append, and metrics.csv's epoch counts on across fits (the Recorder's row number),
/// so successive fits' rows are told apart.
class CSVLogger : public Callback {
 public:
  explicit CSVLogger(std::string dir);
  std::string name() const override { return "CSVLogger"; }
  void before_fit(Learner& learn) override;
  void after_epoch(Learner& learn) override;
  void after_fit(Learner& learn) override;

 private:
  void write_new_rows(const Recorder& rec);
  void write_new_steps(const Recorder& rec);
  void flush();
  std::string dir_;
  std::ofstream metrics_, steps_;
  size_t steps_written_ = 0, epochs_written_ = 0;
};

} // namespace mixtrain::callbacks
