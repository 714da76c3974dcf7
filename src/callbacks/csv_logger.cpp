#include "mixtrain/callbacks/csv_logger.h"

#include "mixtrain/learner.h"

#include <cmath>
#include <filesystem>
#include <cstring>

namespace mixtrain::callbacks {

namespace {
void open_or_throw(std::ofstream& f, const std::string& path) {
  f.open(path, std::ios::out | std::ios::trunc);
  TORCH_CHECK(f.is_open(), "Cannot write ", path, ": ", std::strerror(errno));
  f.precision(9);
}
} // namespace

CSVLogger::CSVLogger(std::string dir) : dir_(std::move(dir)) { order = 70; }

void CSVLogger::before_fit(Learner& learn) {
  if (metrics_.is_open()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);  // a folder that does not exist yet is made
  TORCH_CHECK(!ec, "Cannot create ", dir_, ": ", ec.message());
  open_or_throw(metrics_, dir_ + "/metrics.csv");
  open_or_throw(steps_, dir_ + "/steps.csv");
  metrics_ << "epoch,train_loss,valid_loss";
  for (const auto& n : learn.recorder().metric_names()) metrics_ << ',' << n;
  metrics_ << ",seconds\n";
  steps_ << "iter,epoch,loss,smooth_loss,lr,scale,skipped\n";
  // History the Recorder already holds (a resumed run's) is written first, so
  // the files always match the Recorder.
  write_new_rows(learn.recorder());
  flush();
}

void CSVLogger::write_new_rows(const Recorder& rec) {
  for (; epochs_written_ < rec.values().size(); ++epochs_written_) {
    const EpochRecord& e = rec.values()[epochs_written_];
    metrics_ << epochs_written_ << ',' << e.train_loss << ',' << e.valid_loss;
    for (double m : e.metrics) metrics_ << ',' << m;
    metrics_ << ',' << e.seconds << '\n';
  }
  write_new_steps(rec);
}

void CSVLogger::write_new_steps(const Recorder& rec) {
  for (; steps_written_ < rec.steps().size(); ++steps_written_) {
    const StepRecord& s = rec.steps()[steps_written_];
    steps_ << s.iter << ',' << s.epoch << ',' << s.loss << ',' << s.smooth_loss << ',' << s.lr << ',';
    if (std::isfinite(s.scale)) steps_ << s.scale;  // empty when no loss scale was used
    steps_ << ',' << (s.skipped ? 1 : 0) << '\n';
  }
}

void CSVLogger::flush() {
  metrics_.flush();
  steps_.flush();
  TORCH_CHECK(metrics_.good() && steps_.good(), "Writing CSV logs in ", dir_, " failed (disk full?)");
}

void CSVLogger::after_epoch(Learner& learn) {
  write_new_rows(learn.recorder());
  flush();
}

void CSVLogger::after_fit(Learner& learn) {
  if (!metrics_.is_open()) return;
  write_new_rows(learn.recorder());
  flush();
}

} // namespace mixtrain::callbacks
