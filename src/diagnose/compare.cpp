#include "mixtrain/diagnose/compare.h"

#include "../first_line.h"

#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/amp/precision_callback.h"
#include "mixtrain/diagnose/fit_warning.h"
#include "mixtrain/diagnose/gradient_health.h"
#include "mixtrain/diagnose/input_check.h"
#include "mixtrain/diagnose/overflow_trace.h"
#include "mixtrain/learner.h"
#include "mixtrain/option_error.h"

#include <torch/torch.h>

#include <algorithm>
#include <numeric>

namespace mixtrain::diagnose {

RunEvidence summarize_run(Learner& learn, const std::string& precision) {
  RunEvidence r;
  r.precision = precision;
  const auto& steps = learn.recorder().steps();
  for (const auto& s : steps) {
    r.losses.push_back(s.loss);
    r.smooth_losses.push_back(s.smooth_loss);
    r.scales.push_back(s.scale);
    r.skipped.push_back(s.skipped);
    r.epochs.push_back(s.epoch);
  }
  const size_t head = std::min<size_t>(5, r.losses.size());
  if (head > 0) r.first_loss = std::accumulate(r.losses.begin(), r.losses.begin() + head, 0.0) / head;
  if (!learn.recorder().values().empty()) {
    const EpochRecord& last = learn.recorder().values().back();
    r.final_loss = last.train_loss;
    r.valid_loss = last.valid_loss;
    r.metrics = last.metrics;
  }
  r.metric_names = learn.recorder().metric_names();
  const torch::Tensor& y = learn.dls().valid.dataset().y;
  if (y.defined() && y.dim() == 1 && !y.is_floating_point() && y.numel() > 0)
    r.chance_accuracy = 1.0 / static_cast<double>(y.max().item<int64_t>() + 1);
  r.scale = analyze_scale_history(steps);
  if (auto pc = learn.precision_cb()) r.emulated = pc->emulated();
  return r;
}

namespace {

void fit(Learner& learn, const CompareOptions& o) {
  torch::manual_seed(o.seed());  // dropout and anything else drawing from the global generator
  if (o.one_cycle())
    learn.fit_one_cycle(o.epochs(), o.lr());
  else
    learn.fit(o.epochs(), o.lr());
}

/// A fixed batch for the diagnostic passes: the first samples, not the loader's
/// shuffled order (drawing from the loader would change the runs' data order).
data::Batch probe_batch(Learner& learn) {
  return data::Batch::head_of(learn.dls().train.dataset(), std::max<int64_t>(1, learn.dls().train.options().batch_size()));
}

} // namespace

Diagnosis compare(const LearnerFactory& make_learner, const CompareOptions& o) {
  TORCH_CHECK(o.precision() == Precision::kFp16 || o.precision() == Precision::kBf16,
              "diagnose::compare: precision must be fp16 or bf16, got ", precision_name(o.precision()));
  TORCH_CHECK(o.epochs() >= 1, "diagnose::compare: epochs must be >= 1, got ", o.epochs());
  Evidence ev;
  const bool fp16 = o.precision() == Precision::kFp16;

  torch::manual_seed(o.seed());
  std::unique_ptr<Learner> baseline = make_learner();
  TORCH_CHECK(baseline, "diagnose::compare: the learner factory returned nothing");
  // Judging needs a loss at the start (the mean of the first 5 steps) and one at the
  // end that are not the same steps.
  const int64_t steps = o.epochs() * baseline->dls().train.num_batches();
  TORCH_CHECK(steps >= kMinCompareSteps, "too few training steps to judge: ", steps, " (", o.epochs(), " epoch(s) of ",
              baseline->dls().train.num_batches(), " batches); the comparison needs at least ", kMinCompareSteps,
              ": more training data, more epochs or a smaller batch size");
  ev.inputs = check_inputs(baseline->dls().train.dataset().x);

  // D first: nothing else needs to run when the precision cannot.
  try {
    amp::check_precision_supported(compute_dtype(o.precision()), baseline->device(), o.allow_fp16_emulation());
  } catch (const OptionError& e) {
    ev.unsupported = e.phrase();
  } catch (const c10::Error& e) {
    ev.unsupported = mixtrain::detail::first_line(e.what_without_backtrace());
  } catch (const std::exception& e) {
    ev.unsupported = e.what();
  }
  if (!ev.unsupported.empty()) return decide(std::move(ev));

  // The initial weights, so that the mixed run starts exactly where the baseline did.
  std::vector<torch::Tensor> initial;
  for (const auto& t : baseline->model().state_tensors()) initial.push_back(t.clone());

  fit(*baseline, o);
  ev.fp32 = summarize_run(*baseline, "fp32");

  torch::manual_seed(o.seed());
  std::unique_ptr<Learner> mixed = make_learner();
  TORCH_CHECK(mixed, "diagnose::compare: the learner factory returned nothing");
  {
    const auto state = mixed->model().state_tensors();
    TORCH_CHECK(state.size() == initial.size(), "diagnose::compare: the learner factory built two different models");
    for (size_t i = 0; i < state.size(); ++i) state[i].copy_(initial[i]);
  }
  mixed->set_precision(o.precision(), PrecisionOptions()
                                         .scaler(o.scaler())
                                         .allow_fp16_emulation(o.allow_fp16_emulation())
                                         .keep_fp32(o.keep_fp32()));
  // The verdict speaks for this run: no end-of-fit warning that could say otherwise.
  while (auto warning = mixed->get_cb<FitWarning>()) mixed->remove_cb(warning);

  const data::Batch probe = probe_batch(*mixed);
  // bf16 has fp32's exponent range: there is no fp16 overflow to trace.
  if (fp16) ev.trace_start = trace_overflow(*mixed, probe);
  fit(*mixed, o);
  ev.mixed = summarize_run(*mixed, fp16 ? "fp16" : "bf16");
  if (fp16) {
    ev.trace_end = trace_overflow(*mixed, probe);
    auto pc = mixed->precision_cb();
    ev.gradients = measure_gradients(*mixed, probe, pc ? pc->loss_scale() : 1.0);
  }
  return decide(std::move(ev));
}

Diagnosis compare(const LearnerFactory& make_learner, int64_t epochs, double lr) {
  return compare(make_learner, CompareOptions().epochs(epochs).lr(lr));
}

} // namespace mixtrain::diagnose
