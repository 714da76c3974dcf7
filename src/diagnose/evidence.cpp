// The doctor's evidence from a run: its steps, its epochs, what its mode counted, and what a
// parameter costs in it (mixtrain/diagnose/compare.h, evidence.h).
#include "evidence.h"

#include "util/first_line.h"

#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/core/optimizers.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/diagnose/compare.h"
#include "mixtrain/diagnose/scale_analysis.h"
#include "mixtrain/util/option_error.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

namespace mixtrain::diagnose {

double bytes_per_param(Learner& learn) {
  int64_t params = 0, weights = 0, grads = 0, state = 0;
  for (const auto& p : learn.model().module().parameters()) {
    params += p.numel();
    weights += p.numel() * static_cast<int64_t>(p.element_size());
    grads += p.numel() * static_cast<int64_t>(p.element_size());  // every trained weight gets one
  }
  if (params == 0) return 0;
  if (learn.has_opt())
    for (auto& kv : learn.opt().state())
      if (const auto tensors = mixtrain::state_tensors(*kv.second))
        for (const torch::Tensor* t : *tensors)
          if (t->defined()) state += t->numel() * static_cast<int64_t>(t->element_size());
  const auto pc = learn.precision_cb();
  if (const auto m = pc ? pc->param_memory() : std::nullopt) {
    // The mode's own layout; master weights keep their optimizer state in fp32 beside them.
    const int64_t s = m->optimizer_state > 0 ? m->optimizer_state : state;
    return static_cast<double>(m->model + m->masters + m->grads + s + m->compensation) / static_cast<double>(params);
  }
  return static_cast<double>(weights + grads + state) / static_cast<double>(params);
}

namespace detail {

double start_valid_loss(Learner& learn) {
  if (learn.dls().valid.num_batches() == 0) return std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v = learn.validate();
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : v[0];
}

Phrase why_unsupported(const CompareOptions& o, c10::Device device) {
  try {
    amp::check_precision_supported(compute_dtype(o.precision()), device, o.precision_options().allow_fp16_emulation());
  } catch (const OptionError& e) {
    return e.phrase();
  } catch (const c10::Error& e) {
    return Phrase(mixtrain::detail::first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return Phrase(e.what());
  }
  return Phrase();
}

RunEvidence summarize_steps(Learner& learn, size_t from, const std::string& precision) {
  RunEvidence r;
  r.precision = precision;
  r.first_step = static_cast<int64_t>(from);
  const auto& all = learn.recorder().steps();
  const std::vector<StepRecord> steps(all.begin() + static_cast<std::ptrdiff_t>(std::min(from, all.size())), all.end());
  for (const auto& s : steps) {
    r.losses.push_back(s.loss);
    r.smooth_losses.push_back(s.smooth_loss);
    r.scales.push_back(s.scale);
    r.skipped.push_back(s.skipped);
    r.epochs.push_back(s.epoch);
  }
  const size_t head = std::min<size_t>(5, r.losses.size());
  if (head > 0) r.first_loss = std::accumulate(r.losses.begin(), r.losses.begin() + head, 0.0) / head;
  r.metric_names = learn.recorder().metric_names();
  const torch::Tensor& y = learn.dls().valid.dataset().y;
  if (y.defined() && y.dim() == 1 && !y.is_floating_point() && y.numel() > 0)
    r.chance_accuracy = 1.0 / static_cast<double>(y.max().item<int64_t>() + 1);
  r.scale = analyze_scale_history(steps);
  if (auto pc = learn.precision_cb()) {
    r.emulated = pc->emulated();
    r.lost = pc->lost_updates();
  }
  r.bytes_per_param = bytes_per_param(learn);
  return r;
}

} // namespace detail

RunEvidence summarize_run(Learner& learn, const std::string& precision) {
  RunEvidence r = detail::summarize_steps(learn, 0, precision);
  if (!learn.recorder().values().empty()) {
    const EpochRecord& last = learn.recorder().values().back();
    r.final_loss = last.train_loss;
    r.valid_loss = last.valid_loss;
    r.metrics = last.metrics;
  }
  return r;
}

} // namespace mixtrain::diagnose
