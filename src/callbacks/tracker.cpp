#include "mixtrain/callbacks/tracker.h"

#include "util/archive_util.h"
#include "mixtrain/core/learner.h"

#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>

namespace mixtrain::callbacks {

namespace {
bool lower_is_better(const std::string& monitor) {
  return monitor.find("loss") != std::string::npos || monitor.find("error") != std::string::npos;
}
} // namespace

std::vector<std::string> monitorable_values(const Recorder& recorder) {
  std::vector<std::string> out{"train_loss", "valid_loss"};
  for (const auto& n : recorder.metric_names()) out.push_back(n);
  return out;
}

std::string monitorable_list(const Recorder& recorder) {
  std::string out;
  for (const auto& n : monitorable_values(recorder)) out += (out.empty() ? "" : ", ") + n;
  return out;
}

TrackerCallback::TrackerCallback(std::string monitor, double min_delta)
    : monitor_(std::move(monitor)), min_delta_(std::abs(min_delta)), lower_is_better_(lower_is_better(monitor_)),
      best_(lower_is_better_ ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity()) {
  order = 60;
}

void TrackerCallback::before_fit(Learner& learn) {
  if (!learn.resuming()) {  // fastai's reset_on_fit; a resumed fit continues from the checkpoint's best
    best_ = lower_is_better_ ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    best_epoch_ = -1;
    on_fit_start();
  }
  const auto choices = monitorable_values(learn.recorder());
  TORCH_CHECK(std::find(choices.begin(), choices.end(), monitor_) != choices.end(), "Unknown monitored value '",
              monitor_, "' (choices: ", monitorable_list(learn.recorder()), ")");
}

void TrackerCallback::after_epoch(Learner& learn) {
  if (learn.recorder().values().empty()) return;
  const EpochRecord& e = learn.recorder().values().back();
  double value = monitor_ == "valid_loss" ? e.valid_loss : monitor_ == "train_loss" ? e.train_loss : NAN;
  const auto names = learn.recorder().metric_names();
  for (size_t i = 0; i < names.size() && i < e.metrics.size(); ++i)
    if (names[i] == monitor_) value = e.metrics[i];
  // fastai's comparison: value -/+ min_delta strictly better than the best.
  const bool improved = std::isfinite(value) && (lower_is_better_ ? value + min_delta_ < best_ : value - min_delta_ > best_);
  if (improved) {
    best_ = value;
    best_epoch_ = e.epoch;
  }
  on_epoch_tracked(learn, improved);
}

void TrackerCallback::save_tracker(torch::serialize::OutputArchive& ar) const {
  mixtrain::detail::write_f64(ar, "best", best_);
  mixtrain::detail::write_i64(ar, "best_epoch", best_epoch_);
}

void TrackerCallback::load_tracker(torch::serialize::InputArchive& ar) {
  best_ = mixtrain::detail::read_f64(ar, "best");
  best_epoch_ = mixtrain::detail::read_i64(ar, "best_epoch");
}

SaveModel::SaveModel(std::string monitor, double min_delta, bool restore_best)
    : TrackerCallback(std::move(monitor), min_delta), restore_best_(restore_best) {}

void SaveModel::on_epoch_tracked(Learner& learn, bool improved) {
  if (!improved) return;
  best_state_.clear();
  for (const auto& t : learn.model().state_tensors()) best_state_.push_back(t.clone());
}

void SaveModel::after_fit(Learner& learn) {
  if (!restore_best_ || best_state_.empty()) return;
  const auto state = learn.model().state_tensors();
  if (state.size() != best_state_.size()) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < state.size(); ++i) state[i].copy_(best_state_[i]);
}

void SaveModel::save_state(torch::serialize::OutputArchive& ar) const {
  save_tracker(ar);
  mixtrain::detail::write_i64(ar, "num_tensors", static_cast<int64_t>(best_state_.size()));
  for (size_t i = 0; i < best_state_.size(); ++i) ar.write("best." + std::to_string(i), best_state_[i], /*is_buffer=*/true);
}

void SaveModel::load_state(torch::serialize::InputArchive& ar) {
  load_tracker(ar);
  const int64_t n = mixtrain::detail::read_i64(ar, "num_tensors");
  best_state_.clear();
  for (int64_t i = 0; i < n; ++i) best_state_.push_back(mixtrain::detail::read_tensor(ar, "best." + std::to_string(i)));
}

EarlyStopping::EarlyStopping(std::string monitor, double min_delta, int64_t patience)
    : TrackerCallback(std::move(monitor), min_delta), patience_(patience) {
  TORCH_CHECK(patience >= 0, "Invalid patience: ", patience, " (must be >= 0)");
}

void EarlyStopping::on_epoch_tracked(Learner& learn, bool improved) {
  wait_ = improved ? 0 : wait_ + 1;
  if (improved || wait_ < patience_) return;  // fastai: stop once wait reaches patience
  const int64_t epoch = learn.recorder().values().back().epoch;
  stopped_epoch_ = epoch;
  std::cerr << "mixtrain: no improvement in " << monitor() << " since epoch " << epoch - wait_
            << ": early stopping" << std::endl;
  throw CancelFitException();
}

void EarlyStopping::save_state(torch::serialize::OutputArchive& ar) const {
  save_tracker(ar);
  mixtrain::detail::write_i64(ar, "wait", wait_);
}

void EarlyStopping::load_state(torch::serialize::InputArchive& ar) {
  load_tracker(ar);
  wait_ = mixtrain::detail::read_i64(ar, "wait");
}

} // namespace mixtrain::callbacks
