#include "mixtrain/recorder.h"

#include "mixtrain/learner.h"

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

void Recorder::before_fit(Learner&) {
  // fastai restarts the smoothed loss every fit.
  smooth_value_ = 0;
  smooth_count_ = 0;
}

void Recorder::before_epoch(Learner&) {
  epoch_start_ = now_seconds();
  epoch_steps_ = epoch_skipped_ = epoch_samples_ = 0;
  train_seconds_ = 0;
}

void Recorder::before_train(Learner&) { train_start_ = now_seconds(); }

void Recorder::after_train(Learner&) { train_seconds_ = now_seconds() - train_start_; }

void Recorder::after_batch(Learner& learn) {
  if (!learn.loss().defined()) return;
  const double loss = learn.loss().item<double>();
  if (learn.training()) {
    smooth_value_ = kSmoothBeta * smooth_value_ + (1 - kSmoothBeta) * loss;
    ++smooth_count_;
    StepRecord r;
    r.iter = static_cast<int64_t>(steps_.size());
    r.epoch = learn.epoch();
    r.loss = loss;
    r.smooth_loss = smooth_value_ / (1 - std::pow(kSmoothBeta, static_cast<double>(smooth_count_)));
    r.lr = get_lr(learn.opt());
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

void Recorder::after_validate(Learner&) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double n = static_cast<double>(valid_count_);
  last_validation_.assign(1, valid_count_ ? valid_loss_sum_ / n : nan);
  for (double s : metric_sums_) last_validation_.push_back(valid_count_ ? s / n : nan);
}

void Recorder::after_epoch(Learner& learn) {
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

} // namespace mixtrain
