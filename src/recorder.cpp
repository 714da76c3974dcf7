#include "mixtrain/recorder.h"

#include "mixtrain/learner.h"

#include "archive_util.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace mixtrain {

namespace {
double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}
} // namespace

Recorder::Recorder(std::vector<Metric> metrics) : metrics_(std::move(metrics)) {
  order = 50;
  for (const auto& m : metrics_) TORCH_CHECK(m.fn, "Metric '", m.name, "' has no function");
}

StepRecord& Recorder::last_step() {
  TORCH_CHECK(!steps_.empty(), "Recorder has no step yet");
  return steps_.back();
}

std::vector<std::string> Recorder::metric_names() const {
  std::vector<std::string> names;
  for (const auto& m : metrics_) names.push_back(m.name);
  return names;
}

void Recorder::clear() {
  steps_.clear();
  epochs_.clear();
  last_validation_.clear();
}

void Recorder::before_fit(Learner& learn) {
  if (learn.resuming()) return;  // the checkpoint restored the smoothed loss
  // fastai restarts the smoothed loss every fit.
  smooth_value_ = 0;
  smooth_count_ = 0;
}

void Recorder::before_epoch(Learner& learn) {
  epoch_start_ = now_seconds();
  epoch_validated_ = false;
  if (learn.resuming()) return;  // continuing an epoch: keep its counts from the checkpoint
  epoch_steps_ = epoch_skipped_ = epoch_samples_ = 0;
  train_seconds_ = 0;
}

void Recorder::before_train(Learner&) { train_start_ = now_seconds(); }

void Recorder::after_train(Learner&) { train_seconds_ = now_seconds() - train_start_; }

void Recorder::after_batch(Learner& learn) {
  if (!learn.loss().defined()) return;
  const double loss = learn.loss_value();
  if (learn.training()) {
    smooth_value_ = kSmoothBeta * smooth_value_ + (1 - kSmoothBeta) * loss;
    ++smooth_count_;
    StepRecord r;
    r.iter = static_cast<int64_t>(steps_.size());
    r.epoch = learn.epoch();
    r.loss = loss;
    r.smooth_loss = smooth_value_ / (1 - std::pow(kSmoothBeta, static_cast<double>(smooth_count_)));
    r.lr = get_lr(learn.opt());
    r.mom = get_mom(learn.opt());
    r.scale = learn.step_info().scale;
    r.skipped = learn.step_info().skipped;
    r.grad_norm = learn.step_info().grad_norm;
    steps_.push_back(r);
    ++epoch_steps_;
    epoch_samples_ += learn.batch().size();
    return;
  }
  const int64_t bs = learn.batch().size();
  valid_loss_sum_ += loss * bs;
  for (size_t i = 0; i < metrics_.size(); ++i)
    metric_sums_[i] += metrics_[i].fn(learn.pred(), learn.batch().y).item<double>() * bs;
  valid_count_ += bs;
}

void Recorder::before_validate(Learner&) {
  valid_loss_sum_ = 0;
  valid_count_ = 0;
  metric_sums_.assign(metrics_.size(), 0.0);
}

void Recorder::after_validate(Learner& learn) {
  epoch_validated_ = learn.n_epoch() > 0;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double n = static_cast<double>(valid_count_);
  last_validation_.assign(1, valid_count_ ? valid_loss_sum_ / n : nan);
  for (size_t i = 0; i < metric_sums_.size(); ++i) {
    const double mean = valid_count_ ? metric_sums_[i] / n : nan;
    last_validation_.push_back(metrics_[i].finalize ? metrics_[i].finalize(mean) : mean);
  }
}

void Recorder::after_epoch(Learner& learn) { record_epoch(learn); }

void Recorder::after_fit(Learner& learn) {
  if (epoch_validated_) record_epoch(learn);
}

void Recorder::record_epoch(Learner& learn) {
  epoch_validated_ = false;
  EpochRecord e;
  e.epoch = learn.epoch();
  e.train_loss = smooth_count_ ? smooth_value_ / (1 - std::pow(kSmoothBeta, static_cast<double>(smooth_count_)))
                               : std::numeric_limits<double>::quiet_NaN();
  e.valid_loss = last_validation_.empty() ? std::numeric_limits<double>::quiet_NaN() : last_validation_[0];
  e.metrics.assign(last_validation_.begin() + (last_validation_.empty() ? 0 : 1), last_validation_.end());
  e.metrics.resize(metrics_.size(), std::numeric_limits<double>::quiet_NaN());
  e.seconds = now_seconds() - epoch_start_;
  e.train_seconds = train_seconds_;
  e.samples = epoch_samples_;
  e.steps = epoch_steps_;
  for (auto it = steps_.end() - epoch_steps_; it != steps_.end(); ++it) epoch_skipped_ += it->skipped;
  e.skipped = epoch_skipped_;
  epochs_.push_back(std::move(e));
}

int64_t Recorder::skipped_steps() const {
  return std::count_if(steps_.begin(), steps_.end(), [](const StepRecord& s) { return s.skipped; });
}

namespace {
// Columns of the step and epoch histories in a checkpoint (the order in save_state's rows).
constexpr int kStepColumns = 9;
constexpr int kEpochColumns = 7;
} // namespace

void Recorder::save_state(torch::serialize::OutputArchive& ar) const {
  std::vector<double> cols[kStepColumns];
  for (const auto& s : steps_) {
    const double row[kStepColumns] = {double(s.iter), double(s.epoch), s.loss,      s.smooth_loss, s.lr,
                                      s.scale,         double(s.skipped), s.grad_norm, s.mom};
    for (int c = 0; c < kStepColumns; ++c) cols[c].push_back(row[c]);
  }
  for (int c = 0; c < kStepColumns; ++c) detail::write_f64s(ar, "steps." + std::to_string(c), cols[c]);
  std::vector<double> ecols[kEpochColumns], metrics;
  for (const auto& e : epochs_) {
    const double row[kEpochColumns] = {double(e.epoch),   e.train_loss,      e.valid_loss,   e.seconds,
                                       e.train_seconds, double(e.samples), double(e.steps)};
    for (int c = 0; c < kEpochColumns; ++c) ecols[c].push_back(row[c]);
    metrics.insert(metrics.end(), e.metrics.begin(), e.metrics.end());
  }
  for (int c = 0; c < kEpochColumns; ++c) detail::write_f64s(ar, "epochs." + std::to_string(c), ecols[c]);
  std::vector<double> skipped;
  for (const auto& e : epochs_) skipped.push_back(double(e.skipped));
  detail::write_f64s(ar, "epochs.skipped", skipped);
  detail::write_f64s(ar, "epochs.metrics", metrics);
  detail::write_i64(ar, "num_metrics", static_cast<int64_t>(metrics_.size()));
  detail::write_f64s(ar, "last_validation", last_validation_);
  detail::write_f64(ar, "smooth_value", smooth_value_);
  detail::write_i64(ar, "smooth_count", smooth_count_);
  detail::write_i64(ar, "epoch_steps", epoch_steps_);
  detail::write_i64(ar, "epoch_samples", epoch_samples_);
}

void Recorder::load_state(torch::serialize::InputArchive& ar) {
  const int64_t k = detail::read_i64(ar, "num_metrics");
  TORCH_CHECK(k == static_cast<int64_t>(metrics_.size()), "saved with ", k, " metrics, this learner has ",
              metrics_.size());
  std::vector<double> cols[kStepColumns];
  for (int c = 0; c < kStepColumns; ++c) cols[c] = detail::read_f64s(ar, "steps." + std::to_string(c));
  std::vector<double> ecols[kEpochColumns];
  for (int c = 0; c < kEpochColumns; ++c) ecols[c] = detail::read_f64s(ar, "epochs." + std::to_string(c));
  const auto skipped = detail::read_f64s(ar, "epochs.skipped");
  const auto metrics = detail::read_f64s(ar, "epochs.metrics");
  for (int c = 1; c < kStepColumns; ++c) TORCH_CHECK(cols[c].size() == cols[0].size(), "step history is inconsistent");
  for (int c = 1; c < kEpochColumns; ++c) TORCH_CHECK(ecols[c].size() == ecols[0].size(), "epoch history is inconsistent");
  TORCH_CHECK(skipped.size() == ecols[0].size() && metrics.size() == ecols[0].size() * static_cast<size_t>(k),
              "epoch history is inconsistent");
  std::vector<StepRecord> steps;
  for (size_t i = 0; i < cols[0].size(); ++i) {
    StepRecord s;
    s.iter = static_cast<int64_t>(cols[0][i]);
    s.epoch = static_cast<int64_t>(cols[1][i]);
    s.loss = cols[2][i];
    s.smooth_loss = cols[3][i];
    s.lr = cols[4][i];
    s.scale = cols[5][i];
    s.skipped = cols[6][i] != 0;
    s.grad_norm = cols[7][i];
    s.mom = cols[8][i];
    steps.push_back(s);
  }
  std::vector<EpochRecord> epochs;
  for (size_t i = 0; i < ecols[0].size(); ++i) {
    EpochRecord e;
    e.epoch = static_cast<int64_t>(ecols[0][i]);
    e.train_loss = ecols[1][i];
    e.valid_loss = ecols[2][i];
    e.seconds = ecols[3][i];
    e.train_seconds = ecols[4][i];
    e.samples = static_cast<int64_t>(ecols[5][i]);
    e.steps = static_cast<int64_t>(ecols[6][i]);
    e.skipped = static_cast<int64_t>(skipped[i]);
    e.metrics.assign(metrics.begin() + i * k, metrics.begin() + (i + 1) * k);
    epochs.push_back(std::move(e));
  }
  const auto last_validation = detail::read_f64s(ar, "last_validation");
  const double smooth_value = detail::read_f64(ar, "smooth_value");
  const int64_t smooth_count = detail::read_i64(ar, "smooth_count");
  const int64_t epoch_steps = detail::read_i64(ar, "epoch_steps");
  const int64_t epoch_samples = detail::read_i64(ar, "epoch_samples");
  steps_ = std::move(steps);
  epochs_ = std::move(epochs);
  last_validation_ = last_validation;
  smooth_value_ = smooth_value;
  smooth_count_ = smooth_count;
  epoch_steps_ = epoch_steps;
  epoch_samples_ = epoch_samples;
}

} // namespace mixtrain
