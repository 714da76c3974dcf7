#pragma once
/// Progress output: fastai's epoch table, plus a live bar on a terminal.

#include "mixtrain/core/callback.h"

#include <iosfwd>
#include <string>
#include <vector>

namespace mixtrain { struct EpochRecord; }

namespace mixtrain::callbacks {

/// Prints the epoch table (epoch, train_loss, valid_loss, metrics, time).
/// On a TTY it also draws a live bar with batches/s and ETA; otherwise it prints
/// exactly one plain line per epoch, which suits logs and CI. Order 60.
class ProgressCallback : public Callback {
 public:
  /// Writes to stdout; the live bar is shown when stdout is a terminal.
  ProgressCallback();
  /// Writes to `out`; `live` turns the bar on or off.
  ProgressCallback(std::ostream& out, bool live);
  std::string name() const override { return "ProgressCallback"; }

  void before_fit(Learner& learn) override;
  void before_train(Learner& learn) override;
  void before_validate(Learner& learn) override;
  void after_batch(Learner& learn) override;
  void after_epoch(Learner& learn) override;
  void after_fit(Learner& learn) override;

 private:
  void draw_bar(Learner& learn, bool force);
  void print_new_rows(Learner& learn);
  void print_row(Learner& learn, const EpochRecord& e);
  size_t rows_printed_ = 0;
  std::ostream& out_;
  bool live_;
  std::vector<std::string> columns_;
  std::string phase_;
  double phase_start_ = 0;
  double last_draw_ = 0;
};

/// Formats seconds as fastai does: "mm:ss" (or "h:mm:ss").
std::string format_time(double seconds);

} // namespace mixtrain::callbacks
