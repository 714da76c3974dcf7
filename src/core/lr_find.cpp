// fastai's lr_find: the sweep (a callback), the suggestions, the restore, the chart.
#include "mixtrain/core/lr_find.h"

#include "mixtrain/callbacks/progress.h"
#include "mixtrain/util/svg_plot.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/util/option_error.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <sstream>

namespace mixtrain {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Sets the learning rate of each step, records the curve, stops on divergence or
/// after num_it steps, and skips validation (fastai's LRFinder callback).
class LRFinder : public Callback {
 public:
  explicit LRFinder(const LrFindOptions& o) : o_(o) { order = 60; }  // after the Recorder (50)
  std::string name() const override { return "LRFinder"; }

  void before_batch(Learner& learn) override {
    if (!learn.training()) return;
    const double pos = static_cast<double>(learn.train_iter()) / static_cast<double>(o_.num_it());
    lr_ = o_.start_lr() * std::pow(o_.end_lr() / o_.start_lr(), pos);
    set_lr(learn.opt(), lr_);
  }

  void after_batch(Learner& learn) override {
    if (!learn.training()) return;
    const double loss = learn.loss().defined() ? learn.loss().item<double>() : kNaN;
    r.lrs.push_back(lr_);
    r.losses.push_back(loss);
    r.skipped.push_back(learn.step_info().skipped);
    // A non-finite loss (an fp16 overflow) is not smoothed in: it would poison every later point.
    if (std::isfinite(loss)) {
      smooth_.add(loss);
    }
    const double smooth = smooth_.value();
    r.smooth_losses.push_back(smooth);
    if (std::isfinite(smooth)) best_ = std::min(best_, smooth);
    if (o_.stop_div() && (!std::isfinite(loss) || smooth > 4 * best_)) {
      r.diverged = true;
      throw CancelFitException();
    }
    if (learn.train_iter() >= o_.num_it()) throw CancelFitException();
  }

  void before_validate(Learner&) override { throw CancelValidateException(); }

  LrFindResult r;

 private:
  LrFindOptions o_;
  double lr_ = 0, best_ = std::numeric_limits<double>::infinity();
  SmoothedLoss smooth_;  // fastai's, as the Recorder's
};

/// The curve lr_find reads suggestions from: fastai drops the first num_it/10
/// points (the start's noise) and the last 5 (the blow-up), and we drop steps
/// without a smoothed loss.
void trimmed(const LrFindResult& r, int64_t num_it, std::vector<double>& lrs, std::vector<double>& losses) {
  const auto n = static_cast<int64_t>(r.lrs.size());
  for (int64_t i = num_it / 10; i < n - 5; ++i)
    if (std::isfinite(r.smooth_losses[i])) {
      lrs.push_back(r.lrs[i]);
      losses.push_back(r.smooth_losses[i]);
    }
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1e", v);
  return buf;
}

} // namespace

double suggest_minimum(const std::vector<double>& lrs, const std::vector<double>& losses) {
  if (lrs.empty() || lrs.size() != losses.size()) return kNaN;
  return lrs[std::min_element(losses.begin(), losses.end()) - losses.begin()] / 10;
}

double suggest_steep(const std::vector<double>& lrs, const std::vector<double>& losses) {
  if (lrs.size() < 2 || lrs.size() != losses.size()) return kNaN;
  size_t best = 0;
  double best_grad = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i + 1 < lrs.size(); ++i) {
    const double grad = (losses[i + 1] - losses[i]) / (std::log(lrs[i + 1]) - std::log(lrs[i]));
    if (grad < best_grad) best_grad = grad, best = i;
  }
  return lrs[best];
}

double suggest_valley(const std::vector<double>& lrs, const std::vector<double>& losses) {
  // fastai's valley: the longest decreasing run (longest decreasing subsequence
  // ending at each point), then a point a third of the way into it plus a sixth.
  const auto n = static_cast<int64_t>(losses.size());
  if (n < 2 || static_cast<int64_t>(lrs.size()) != n) return kNaN;
  std::vector<int64_t> lds(static_cast<size_t>(n), 1);
  int64_t max_start = 0, max_end = 0;
  for (int64_t i = 1; i < n; ++i)
    for (int64_t j = 0; j < i; ++j) {
      if (losses[i] < losses[j] && lds[i] < lds[j] + 1) lds[i] = lds[j] + 1;
      if (lds[max_end] < lds[i]) {
        max_end = i;
        max_start = max_end - lds[max_end];  // -1 when the run starts at the first point (fastai's formula)
      }
    }
  const double sections = static_cast<double>(max_end - max_start) / 3;
  const int64_t idx = max_start + static_cast<int64_t>(sections) + static_cast<int64_t>(sections / 2);
  return lrs[static_cast<size_t>(std::clamp<int64_t>(idx, 0, n - 1))];
}

std::string LrFindResult::summary() const {
  return "valley " + sci(valley) + ", steep " + sci(steep) + ", minimum/10 " + sci(minimum);
}

std::string LrFindResult::csv() const {
  std::ostringstream out;
  out.precision(9);
  out << "step,lr,loss,smooth_loss,skipped\n";
  for (size_t i = 0; i < lrs.size(); ++i)
    out << i << "," << lrs[i] << "," << losses[i] << "," << smooth_losses[i] << "," << (skipped[i] ? 1 : 0) << "\n";
  return out.str();
}

std::string LrFindResult::svg() const {
  PlotSeries curve{"smoothed loss", lrs, smooth_losses};
  PlotSeries skips{"skipped step (fp16)", {}, {}, "#d62728", false, true};
  for (size_t i = 0; i < lrs.size(); ++i)
    if (skipped[i]) skips.x.push_back(lrs[i]), skips.y.push_back(smooth_losses[i]);
  std::vector<PlotSeries> series{curve};
  if (!skips.x.empty()) series.push_back(skips);
  // The suggestions as labelled markers on the curve.
  const std::pair<const char*, double> marks[] = {{"valley", valley}, {"steep", steep}, {"minimum/10", minimum}};
  const char* colors[] = {"#2ca02c", "#ff7f0e", "#9467bd"};
  for (size_t k = 0; k < 3; ++k) {
    const double lr = marks[k].second;
    if (!std::isfinite(lr) || lrs.empty()) continue;
    const size_t at = std::min_element(lrs.begin(), lrs.end(), [lr](double a, double b) {
                        return std::abs(std::log(a / lr)) < std::abs(std::log(b / lr));
                      }) - lrs.begin();
    series.push_back({std::string(marks[k].first) + " " + sci(lr), {lrs[at]}, {smooth_losses[at]}, colors[k], false, true});
  }
  PlotOptions o;
  o.title = "Learning-rate finder";
  o.x_label = "learning rate (log scale)";
  o.y_label = "smoothed training loss";
  o.log10_x = true;
  return line_plot_svg(series, o);
}

void validate(const LrFindOptions& o) {
  check_option(o.start_lr() > 0 && std::isfinite(o.start_lr()), "start_lr", o.start_lr(), "must be > 0");
  check_option(o.end_lr() > o.start_lr() && std::isfinite(o.end_lr()), "end_lr", o.end_lr(),
               "must be above the start lr " + c10::str(o.start_lr()));
  check_option(o.num_it() >= LrFindOptions::kMinSteps, "num_it", o.num_it(),
               "must be >= " + std::to_string(LrFindOptions::kMinSteps));
}

LrFindResult Learner::lr_find() { return lr_find(LrFindOptions()); }

LrFindResult Learner::lr_find(const LrFindOptions& o) {
  mixtrain::validate(o);  // not Learner::validate
  const int64_t per_epoch = dls_.train.num_batches();
  TORCH_CHECK(per_epoch > 0, "lr_find: the training set has no full batch (", dls_.train.dataset().size(),
              " samples, batch size ", dls_.train.options().batch_size(), ")");

  // Everything a fit changes, as a checkpoint; restored afterwards without its
  // resume point, so the next fit starts fresh as it would have.
  const std::string snapshot = save_to_memory();
  // A checkpoint keeps the training loader's generator as it was when its epoch
  // began (what a resume needs); the next fit needs it as it is now.
  const torch::Tensor loader_state = dls_.train.generator().get_state();
  at::Generator global = at::detail::getDefaultCPUGenerator();
  const torch::Tensor global_state = global.get_state();
  const auto restore = [&] {
    load_from_memory(snapshot.data(), snapshot.size(), "lr_find's snapshot");
    resume_.pending.reset();  // restored, not resumed: the next fit starts afresh
    dls_.train.generator().set_state(loader_state);
    global.set_state(global_state);
  };
  // No progress output during the sweep (fastai's no_logging).
  std::vector<CallbackPtr> quiet;
  for (const auto& cb : cbs_)
    if (std::dynamic_pointer_cast<callbacks::ProgressCallback>(cb)) quiet.push_back(cb);
  for (const auto& cb : quiet) remove_cb(cb);

  auto finder = std::make_shared<LRFinder>(o);
  const int64_t epochs = o.num_it() / per_epoch + 1;  // fastai's n_epoch: the loader cycles when it is short
  try {
    fit(epochs, o.start_lr(), {finder});
  } catch (...) {
    for (const auto& cb : quiet) add_cb(cb);
    restore();
    throw;
  }
  for (const auto& cb : quiet) add_cb(cb);
  restore();

  LrFindResult r = std::move(finder->r);
  r.epochs = static_cast<int64_t>(r.lrs.size() + static_cast<size_t>(per_epoch) - 1) / per_epoch;
  std::vector<double> lrs, losses;
  trimmed(r, o.num_it(), lrs, losses);
  r.valley = suggest_valley(lrs, losses);
  r.steep = suggest_steep(lrs, losses);
  r.minimum = suggest_minimum(lrs, losses);
  return r;
}

} // namespace mixtrain
