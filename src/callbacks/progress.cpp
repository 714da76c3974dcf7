#include "mixtrain/callbacks/progress.h"

#include "mixtrain/core/learner.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

namespace mixtrain::callbacks {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
constexpr int kColumnWidth = 12;
constexpr double kRedrawSeconds = 0.1;  // a faster redraw only costs terminal time
} // namespace

std::string format_time(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%02ld:%02ld", s / 60, s % 60);
  return buf;
}

ProgressCallback::ProgressCallback() : ProgressCallback(std::cout, ::isatty(STDOUT_FILENO) == 1) {}

ProgressCallback::ProgressCallback(std::ostream& out, bool live) : out_(out), live_(live) { order = 60; }

void ProgressCallback::before_fit(Learner& learn) {
  rows_printed_ = learn.recorder().values().size();  // earlier fits' rows were printed by them
  columns_ = {"epoch", "train_loss", "valid_loss"};
  for (const auto& n : learn.recorder().metric_names()) columns_.push_back(n);
  columns_.push_back("time");
  std::string header;
  for (const auto& c : columns_) {
    std::string cell = c;
    cell.resize(std::max<size_t>(kColumnWidth, c.size() + 1), ' ');
    header += cell;
  }
  while (!header.empty() && header.back() == ' ') header.pop_back();
  out_ << header << std::endl;
}

void ProgressCallback::before_train(Learner&) {
  phase_ = "train";
  phase_start_ = last_draw_ = now_seconds();
}

void ProgressCallback::before_validate(Learner&) {
  phase_ = "valid";
  phase_start_ = last_draw_ = now_seconds();
}

void ProgressCallback::after_batch(Learner& learn) {
  if (live_) draw_bar(learn, false);
}

void ProgressCallback::draw_bar(Learner& learn, bool force) {
  const double now = now_seconds();
  if (!force && now - last_draw_ < kRedrawSeconds) return;
  last_draw_ = now;
  const int64_t done = learn.iter() + 1, total = std::max<int64_t>(learn.n_iter(), 1);
  const double elapsed = now - phase_start_;
  const double rate = elapsed > 0 ? done / elapsed : 0.0;
  const double eta = rate > 0 ? (total - done) / rate : 0.0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / total);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  char line[160];
  // Epochs are numbered from 0, as in the table's rows (fastai's numbering).
  std::snprintf(line, sizeof(line), "\r%s epoch %lld (of %lld) [%s] %lld/%lld %.1f batch/s ETA %s\033[K",
                phase_.c_str(), static_cast<long long>(learn.epoch()), static_cast<long long>(learn.n_epoch()),
                bar.c_str(), static_cast<long long>(done), static_cast<long long>(total), rate,
                format_time(eta).c_str());
  out_ << line << std::flush;
}

void ProgressCallback::after_epoch(Learner& learn) { print_new_rows(learn); }
void ProgressCallback::after_fit(Learner& learn) { print_new_rows(learn); }

void ProgressCallback::print_new_rows(Learner& learn) {
  for (; rows_printed_ < learn.recorder().values().size(); ++rows_printed_) print_row(learn, learn.recorder().values()[rows_printed_]);
}

void ProgressCallback::print_row(Learner& learn, const EpochRecord& e) {
  std::vector<std::string> cells;
  cells.push_back(std::to_string(e.epoch));
  char buf[32];
  auto num = [&](double v) {
    std::snprintf(buf, sizeof(buf), "%.6f", v);
    cells.emplace_back(buf);
  };
  num(e.train_loss);
  num(e.valid_loss);
  for (double m : e.metrics) num(m);
  cells.push_back(format_time(e.seconds));
  std::string row = live_ ? "\r\033[K" : "";
  for (size_t i = 0; i < cells.size(); ++i) {
    std::string cell = cells[i];
    const size_t width = i < columns_.size() ? std::max<size_t>(kColumnWidth, columns_[i].size() + 1) : kColumnWidth;
    cell.resize(std::max(width, cell.size() + 1), ' ');
    row += cell;
  }
  // Skipped steps are never silent: any epoch trained with a loss scale says how many.
  const auto& steps = learn.recorder().steps();
  if (e.steps > 0 && static_cast<int64_t>(steps.size()) >= e.steps && std::isfinite(steps[steps.size() - e.steps].scale))
    row += "skipped " + std::to_string(e.skipped) + "/" + std::to_string(e.steps);
  while (!row.empty() && row.back() == ' ') row.pop_back();
  out_ << row << std::endl;
}

} // namespace mixtrain::callbacks
