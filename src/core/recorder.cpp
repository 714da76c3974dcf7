#include "mixtrain/core/recorder.h"

#include "mixtrain/core/learner.h"

#include "util/archive_util.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

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
  branch_step_ = 0;
}

void Recorder::before_fit(Learner& learn) {
  if (learn.resuming()) return;  // the checkpoint restored the smoothed loss
  // fastai restarts the smoothed loss every fit.
  smooth_.reset();
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
    StepRecord r;
    r.iter = static_cast<int64_t>(steps_.size());
    r.epoch = learn.epoch();
    r.loss = loss;
    if (std::isfinite(loss)) {
      smooth_.add(loss);
      r.smooth_loss = smooth_.value();
    } else {
      // A NaN/inf loss (a skipped fp16 step) would stay in the average for good: the step
      // shows it, and the smoothing starts again after it.
      r.smooth_loss = loss;
      smooth_.reset();
    }
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
  e.train_loss = smooth_.value();
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

int64_t Recorder::own_skipped_steps() const {
  const auto from = steps_.begin() + std::min<int64_t>(branch_step_, static_cast<int64_t>(steps_.size()));
  return std::count_if(from, steps_.end(), [](const StepRecord& s) { return s.skipped; });
}

void Recorder::start_branch() {
  branch_step_ = static_cast<int64_t>(steps_.size());
  smooth_.reset();
}

const std::vector<StepColumn>& step_columns() {
  // Checkpoints store column i as "steps.i": new columns go at the end.
  static const std::vector<StepColumn> kColumns = {
      {"iter", [](const StepRecord& s) { return double(s.iter); }, [](StepRecord& s, double v) { s.iter = int64_t(v); }, false},
      {"epoch", [](const StepRecord& s) { return double(s.epoch); }, [](StepRecord& s, double v) { s.epoch = int64_t(v); }, false},
      {"loss", [](const StepRecord& s) { return s.loss; }, [](StepRecord& s, double v) { s.loss = v; }, false},
      {"smooth_loss", [](const StepRecord& s) { return s.smooth_loss; }, [](StepRecord& s, double v) { s.smooth_loss = v; }, false},
      {"lr", [](const StepRecord& s) { return s.lr; }, [](StepRecord& s, double v) { s.lr = v; }, false},
      {"scale", [](const StepRecord& s) { return s.scale; }, [](StepRecord& s, double v) { s.scale = v; }, true},
      {"skipped", [](const StepRecord& s) { return double(s.skipped); }, [](StepRecord& s, double v) { s.skipped = v != 0; }, false},
      {"grad_norm", [](const StepRecord& s) { return s.grad_norm; }, [](StepRecord& s, double v) { s.grad_norm = v; }, true},
      {"mom", [](const StepRecord& s) { return s.mom; }, [](StepRecord& s, double v) { s.mom = v; }, true},
  };
  return kColumns;
}

const std::vector<EpochColumn>& epoch_columns() {
  // Checkpoints store column i as "epochs.i" (skipped as "epochs.skipped", which came later).
  static const std::vector<EpochColumn> kColumns = {
      {"epoch", [](const EpochRecord& e) { return double(e.epoch); }, [](EpochRecord& e, double v) { e.epoch = int64_t(v); }},
      {"train_loss", [](const EpochRecord& e) { return e.train_loss; }, [](EpochRecord& e, double v) { e.train_loss = v; }},
      {"valid_loss", [](const EpochRecord& e) { return e.valid_loss; }, [](EpochRecord& e, double v) { e.valid_loss = v; }},
      {"seconds", [](const EpochRecord& e) { return e.seconds; }, [](EpochRecord& e, double v) { e.seconds = v; }},
      {"train_seconds", [](const EpochRecord& e) { return e.train_seconds; }, [](EpochRecord& e, double v) { e.train_seconds = v; }},
      {"samples", [](const EpochRecord& e) { return double(e.samples); }, [](EpochRecord& e, double v) { e.samples = int64_t(v); }},
      {"steps", [](const EpochRecord& e) { return double(e.steps); }, [](EpochRecord& e, double v) { e.steps = int64_t(v); }},
      {"skipped", [](const EpochRecord& e) { return double(e.skipped); }, [](EpochRecord& e, double v) { e.skipped = int64_t(v); }},
  };
  return kColumns;
}

std::vector<std::pair<std::string, double>> epoch_table_row(const EpochRecord& e, const std::vector<std::string>& metric_names) {
  std::vector<std::pair<std::string, double>> row{
      {"epoch", double(e.epoch)}, {"train_loss", e.train_loss}, {"valid_loss", e.valid_loss}};
  for (size_t i = 0; i < metric_names.size(); ++i)  // every metric's column, also for a row that has no values yet (the header)
    row.emplace_back(metric_names[i], i < e.metrics.size() ? e.metrics[i] : std::numeric_limits<double>::quiet_NaN());
  row.emplace_back("seconds", e.seconds);
  return row;
}

namespace {
/// The archive key of epoch column `c` (skipped has its own, from when it was added).
std::string epoch_key(size_t c) {
  const std::string name = epoch_columns()[c].name;
  return name == "skipped" ? "epochs.skipped" : "epochs." + std::to_string(c);
}
} // namespace

void Recorder::save_state(torch::serialize::OutputArchive& ar) const {
  const auto& scols = step_columns();
  for (size_t c = 0; c < scols.size(); ++c) {
    std::vector<double> col;
    for (const auto& s : steps_) col.push_back(scols[c].get(s));
    detail::write_f64s(ar, "steps." + std::to_string(c), col);
  }
  const auto& ecols = epoch_columns();
  for (size_t c = 0; c < ecols.size(); ++c) {
    std::vector<double> col;
    for (const auto& e : epochs_) col.push_back(ecols[c].get(e));
    detail::write_f64s(ar, epoch_key(c), col);
  }
  std::vector<double> metrics;
  for (const auto& e : epochs_) metrics.insert(metrics.end(), e.metrics.begin(), e.metrics.end());
  detail::write_f64s(ar, "epochs.metrics", metrics);
  detail::write_i64(ar, "num_metrics", static_cast<int64_t>(metrics_.size()));
  detail::write_f64s(ar, "last_validation", last_validation_);
  detail::write_f64(ar, "smooth_value", smooth_.sum);
  detail::write_i64(ar, "smooth_count", smooth_.count);
  detail::write_i64(ar, "epoch_steps", epoch_steps_);
  detail::write_i64(ar, "epoch_samples", epoch_samples_);
  detail::write_i64(ar, "branch_step", branch_step_);
}

void Recorder::load_state(torch::serialize::InputArchive& ar) {
  const int64_t k = detail::read_i64(ar, "num_metrics");
  TORCH_CHECK(k == static_cast<int64_t>(metrics_.size()), "saved with ", k, " metrics, this learner has ",
              metrics_.size());
  const auto& scols = step_columns();
  std::vector<std::vector<double>> cols(scols.size());
  for (size_t c = 0; c < scols.size(); ++c) cols[c] = detail::read_f64s(ar, "steps." + std::to_string(c));
  const auto& ecols = epoch_columns();
  std::vector<std::vector<double>> ecol(ecols.size());
  for (size_t c = 0; c < ecols.size(); ++c) ecol[c] = detail::read_f64s(ar, epoch_key(c));
  const auto metrics = detail::read_f64s(ar, "epochs.metrics");
  for (size_t c = 1; c < cols.size(); ++c) TORCH_CHECK(cols[c].size() == cols[0].size(), "step history is inconsistent");
  for (size_t c = 1; c < ecol.size(); ++c) TORCH_CHECK(ecol[c].size() == ecol[0].size(), "epoch history is inconsistent");
  TORCH_CHECK(metrics.size() == ecol[0].size() * static_cast<size_t>(k), "epoch history is inconsistent");
  std::vector<StepRecord> steps(cols[0].size());
  for (size_t i = 0; i < steps.size(); ++i)
    for (size_t c = 0; c < scols.size(); ++c) scols[c].set(steps[i], cols[c][i]);
  std::vector<EpochRecord> epochs(ecol[0].size());
  for (size_t i = 0; i < epochs.size(); ++i) {
    for (size_t c = 0; c < ecols.size(); ++c) ecols[c].set(epochs[i], ecol[c][i]);
    epochs[i].metrics.assign(metrics.begin() + i * k, metrics.begin() + (i + 1) * k);
  }
  const auto last_validation = detail::read_f64s(ar, "last_validation");
  const double smooth_value = detail::read_f64(ar, "smooth_value");
  const int64_t smooth_count = detail::read_i64(ar, "smooth_count");
  const int64_t epoch_steps = detail::read_i64(ar, "epoch_steps");
  const int64_t epoch_samples = detail::read_i64(ar, "epoch_samples");
  torch::Tensor branch_step;  // absent from checkpoints written before branches kept it: 0
  const bool has_branch_step = ar.try_read("branch_step", branch_step);
  TORCH_CHECK(!has_branch_step || (branch_step.numel() == 1 && branch_step.item<int64_t>() >= 0 &&
                                   branch_step.item<int64_t>() <= static_cast<int64_t>(steps.size())),
              "branch step is damaged");
  steps_ = std::move(steps);
  epochs_ = std::move(epochs);
  last_validation_ = last_validation;
  smooth_.sum = smooth_value;
  smooth_.count = smooth_count;
  epoch_steps_ = epoch_steps;
  epoch_samples_ = epoch_samples;
  branch_step_ = has_branch_step ? branch_step.item<int64_t>() : 0;
}

} // namespace mixtrain
