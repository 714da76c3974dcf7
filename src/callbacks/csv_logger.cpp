#include "mixtrain/callbacks/csv_logger.h"

#include "mixtrain/core/learner.h"

#include <cmath>
#include <filesystem>
#include <cstring>
#include <utility>

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
  const char* sep = "";
  for (const auto& [name, value] : epoch_table_row(EpochRecord{}, learn.recorder().metric_names()))
    metrics_ << std::exchange(sep, ",") << name;
  metrics_ << '\n';
  sep = "";
  for (const auto& c : step_columns()) steps_ << std::exchange(sep, ",") << c.name;
  steps_ << '\n';
  // History the Recorder already holds (a resumed run's) is written first, so
  // the files always match the Recorder.
  write_new_rows(learn.recorder());
  flush();
}

void CSVLogger::write_new_rows(const Recorder& rec) {
  for (; epochs_written_ < rec.values().size(); ++epochs_written_) {
    EpochRecord e = rec.values()[epochs_written_];
    e.epoch = static_cast<int64_t>(epochs_written_);  // the row's number in this file, across fits
    const char* sep = "";
    for (const auto& [name, value] : epoch_table_row(e, rec.metric_names())) metrics_ << std::exchange(sep, ",") << value;
    metrics_ << '\n';
  }
  write_new_steps(rec);
}

void CSVLogger::write_new_steps(const Recorder& rec) {
  for (; steps_written_ < rec.steps().size(); ++steps_written_) {
    const StepRecord& s = rec.steps()[steps_written_];
    const char* sep = "";
    for (const auto& c : step_columns()) {
      steps_ << std::exchange(sep, ",");
      const double v = c.get(s);
      if (!(c.blank_when_nan && std::isnan(v))) steps_ << v;  // empty: no loss scale, grad norm or momentum
    }
    steps_ << '\n';
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
