// The doctor's two protocols (mixtrain/diagnose/compare.h): the fp32-vs-mixed pair from
// scratch (compare), side by side when it can (side_by_side.h), and a window replayed from a
// run's checkpoint (compare_branch); each ends in the verdict and its trials (trials.h).
#include "mixtrain/diagnose/compare.h"

#include "evidence.h"
#include "phase_clock.h"
#include "side_by_side.h"
#include "trials.h"

#include "mixtrain/callbacks/gradient_clip.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/diagnose/gradient_health.h"
#include "mixtrain/diagnose/input_check.h"
#include "mixtrain/diagnose/overflow_trace.h"
#include "mixtrain/util/option_error.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <numeric>
#include <optional>

namespace mixtrain::diagnose {

namespace {

/// A Learner from the factory, seeded as the runs are, with `initial`'s weights: every arm and
/// trial from scratch starts exactly where the baseline did.
std::unique_ptr<Learner> learner_at(const LearnerFactory& make_learner, const std::vector<torch::Tensor>& initial,
                                    uint64_t seed) {
  torch::manual_seed(seed);
  std::unique_ptr<Learner> learn = make_learner();
  TORCH_CHECK(learn, "diagnose::compare: the learner factory returned nothing");
  TORCH_CHECK(learn->model().state_tensors().size() == initial.size(),
              "diagnose::compare: the learner factory built two different models");
  detail::restore_state(*learn, initial);
  return learn;
}

} // namespace

Diagnosis compare(const LearnerFactory& make_learner, const CompareOptions& o) {
  TORCH_CHECK(mode_of(o.precision()).doctor_compares,
              "diagnose::compare: precision must be ", mode_names(modes_where(&PrecisionMode::doctor_compares)), ", got ",
              precision_name(o.precision()));
  TORCH_CHECK(o.epochs() >= 1, "diagnose::compare: epochs must be >= 1, got ", o.epochs());
  Evidence ev;
  const bool traced = mode_of(o.precision()).traces_overflow;  // fp16 compute: overflow traced to its op
  detail::PhaseClock clock;

  torch::manual_seed(o.seed());
  std::unique_ptr<Learner> baseline = make_learner();
  TORCH_CHECK(baseline, "diagnose::compare: the learner factory returned nothing");
  // Judging needs a loss at the start (the mean of the first 5 steps) and one at the
  // end that are not the same steps.
  const int64_t steps = o.epochs() * baseline->dls().train.num_batches();
  if (steps < kMinCompareSteps)  // an option's fault (a ValueError in Python), said before anything trains
    throw OptionError("epochs", "too few training steps to judge: " + std::to_string(steps) + " (" +
                                    std::to_string(o.epochs()) + " epoch(s) of " +
                                    std::to_string(baseline->dls().train.num_batches()) + " batches); the comparison needs at least " +
                                    std::to_string(kMinCompareSteps) + ": more training data, more " + Phrase::name("epochs") +
                                    " or a smaller " + Phrase::name("bs"));
  ev.inputs = check_inputs(baseline->dls().train.dataset().x);

  // D first: nothing else needs to run when the precision cannot.
  ev.unsupported = detail::why_unsupported(o, baseline->device());
  if (!ev.unsupported.empty()) return decide(std::move(ev));

  // The initial weights, so that the mixed run starts exactly where the baseline did.
  std::vector<torch::Tensor> initial;
  for (const auto& t : baseline->model().state_tensors()) initial.push_back(t.clone());
  // Where both arms start, on the validation set: each arm's progress is measured from it.
  ev.start_valid_loss = detail::start_valid_loss(*baseline);

  // The run under diagnosis: a second model from the factory, from the same weights.
  const auto make_mixed = [&] {
    std::unique_ptr<Learner> learn = learner_at(make_learner, initial, o.seed());
    learn->set_precision(o.precision(), o.precision_options());
    return learn;
  };
  // A trial as the factory builds it, from the same weights: seeded as the runs were.
  const auto make_trial_learner = [&](const MixedRun& t) {
    std::unique_ptr<Learner> learn = learner_at(make_learner, initial, o.seed());
    learn->set_precision(t.precision, t.options);
    if (t.clip > 0) learn->add_cb(std::make_shared<callbacks::GradientClip>(t.clip));
    return learn;
  };
  std::unique_ptr<detail::HeadStartTrial> head;
  std::unique_ptr<Learner> mixed;
  std::optional<OverflowTrace> trace_start;
  // bf16 has fp32's exponent range: there is no fp16 overflow to trace.
  const auto trace_start_of = [&](Learner& learn) {
    if (traced) trace_start = trace_overflow(learn, detail::probe_batch(learn));
  };
  if (detail::why_not_side_by_side(*baseline, o, initial).empty()) {
    mixed = make_mixed();
    if (!detail::share_tensors(*baseline, *mixed)) {
      trace_start_of(*mixed);
      // Built now, before the seed the pair trains from (a factory draws initial weights).
      if (const std::optional<detail::HeadStart> h = o.head_start() ? detail::head_start(o) : std::nullopt) {
        const MixedRun t = detail::run_with(o, h->fix);
        std::unique_ptr<Learner> learn = make_trial_learner(t);
        if (!detail::share_tensors(*learn, *mixed) && !detail::share_tensors(*learn, *baseline))
          head = std::make_unique<detail::HeadStartTrial>(*h, t, std::move(learn), o);
      }
      std::cout << "doctor: the fp32 baseline trains beside the " << precision_name(o.precision()) << " run, "
                << at::get_num_threads() / 2 << " thread(s) each" << std::endl;
      clock.ends("setup");
      // Once the run has ended (a head start still training): the verdict, handed to the
      // caller as it would be before any trial (bf16-pure only, whose evidence has no
      // overflow trace), and whether it tries the head start first.
      const detail::HeadStartTrial::Keep keep = [&] {
        Evidence e = ev;
        e.fp32 = summarize_run(*baseline, "fp32");
        e.mixed = summarize_run(*mixed, precision_name(o.precision()));
        e.side_by_side = true;
        const Diagnosis verdict = decide(std::move(e));
        detail::report_progress(verdict, o);
        const std::vector<Fix> queue = detail::trial_queue(verdict, o);
        return !queue.empty() && detail::same_settings(queue.front().settings, head->what().fix.settings);
      };
      ev.side_by_side = detail::fit_side_by_side(*baseline, *mixed, o, head.get(), keep);
      if (!ev.side_by_side) {  // a draw the probe did not see: the pair trains again, in turn
        head.reset();
        std::cout << "doctor: the model drew random numbers while training; both runs train again, in turn" << std::endl;
        baseline = learner_at(make_learner, initial, o.seed());
        mixed.reset();
      }
    } else {
      mixed.reset();
    }
  }
  if (ev.side_by_side) {
    ev.fp32 = summarize_run(*baseline, "fp32");
  } else {
    if (clock.empty()) clock.ends("setup");
    detail::fit(*baseline, o);
    ev.fp32 = summarize_run(*baseline, "fp32");
    mixed = make_mixed();
    trace_start_of(*mixed);
    detail::fit(*mixed, o);
  }
  clock.ends("pair");
  ev.trace_start = std::move(trace_start);
  const data::Batch probe = detail::probe_batch(*mixed);
  ev.mixed = summarize_run(*mixed, precision_name(o.precision()));
  if (traced) {
    ev.trace_end = trace_overflow(*mixed, probe);
    auto pc = mixed->precision_cb();
    ev.gradients = measure_gradients(*mixed, probe, pc ? pc->loss_scale() : 1.0);
  }
  Diagnosis d = decide(std::move(ev));
  clock.ends("after");
  d.timing = clock.phases();
  detail::report_progress(d, o);  // the verdict is kept before any trial can die or be stopped
  const detail::TrialRunner from_scratch = [&](const MixedRun& t, std::string* next_overflow) {
    std::unique_ptr<Learner> learn = make_trial_learner(t);
    if (next_overflow) *next_overflow = detail::first_overflow_island(*learn);
    detail::fit(*learn, o);
    return summarize_run(*learn, precision_name(t.precision));
  };
  detail::try_fixes(d, from_scratch, o, head.get());
  clock.ends("trials");
  d.timing = clock.phases();
  return d;
}

Diagnosis compare(const LearnerFactory& make_learner, int64_t epochs, double lr) {
  return compare(make_learner, CompareOptions().epochs(epochs).lr(lr));
}

namespace {

/// Ends a fit after `n` training steps (after the Recorder and the Checkpointer saw the last).
class StopAfterSteps : public Callback {
 public:
  explicit StopAfterSteps(int64_t n) : n_(n) { order = 100; }
  std::string name() const override { return "StopAfterSteps"; }
  void after_batch(Learner& learn) override {
    if (learn.training() && ++done_ >= n_) throw CancelFitException();
  }

 private:
  int64_t n_, done_ = 0;
};

/// Trains the next `window` steps of the run's schedule from where `learn` stands (a
/// restored checkpoint).
void replay_fit(Learner& learn, const CompareOptions& o, int64_t window) {
  if (auto pc = learn.precision_cb()) pc->restart_lost_updates();
  std::vector<CallbackPtr> stop{std::make_shared<StopAfterSteps>(window)};
  if (o.one_cycle())
    learn.fit_one_cycle(o.epochs(), o.lr(), OneCycleOptions(), stop);
  else
    learn.fit(o.epochs(), o.lr(), stop);
}

/// The window's evidence once `learn` has replayed it from its step `from` (replay_fit),
/// validated at the end.
RunEvidence window_evidence(Learner& learn, size_t from, const std::string& precision) {
  RunEvidence r = detail::summarize_steps(learn, from, precision);
  // The window's own end: the mean of its last (up to 5) losses, as first_loss is of its
  // first. Not the Recorder's smoothed loss, which carries the run's history before the
  // window (a NaN the run met before it stopped would stay in it).
  const size_t tail = std::min<size_t>(5, r.losses.size());
  if (tail > 0) r.final_loss = std::accumulate(r.losses.end() - static_cast<std::ptrdiff_t>(tail), r.losses.end(), 0.0) / tail;
  const std::vector<double> v = learn.validate();  // the loss, then the metrics
  if (!v.empty()) {
    r.valid_loss = v[0];
    r.metrics.assign(v.begin() + 1, v.end());
  }
  return r;
}

/// Trains the next `window` steps of the run's schedule from where `learn` stands, then
/// validates: the window's evidence.
RunEvidence replay_window(Learner& learn, const CompareOptions& o, int64_t window, const std::string& precision) {
  const size_t from = learn.recorder().steps().size();
  replay_fit(learn, o, window);
  return window_evidence(learn, from, precision);
}

/// Whether `base` (an arm at its branch point) may replay beside the run's arm
/// (CompareOptions::side_by_side): as compare's pair, where that changes no result.
bool may_replay_side_by_side(Learner& base, const CompareOptions& o) {
  if (!o.side_by_side()) return false;
  std::vector<torch::Tensor> state;  // put back after why_not_side_by_side's probe forward
  for (const auto& t : base.model().state_tensors()) state.push_back(t.clone());
  return detail::why_not_side_by_side(base, o, state).empty();
}

/// The fp32 arm and the run's replayed beside each other, each on half the threads. Sets
/// `ev.fp32` and `ev.mixed` and returns true; false where the two share a tensor (nothing
/// trained), or the pair drew from the global generator after all (both trained: they
/// replay again, in turn).
bool replay_side_by_side(Learner& base, Learner& mixed, const CompareOptions& o, int64_t window, Evidence& ev) {
  if (detail::share_tensors(base, mixed)) return false;
  const size_t base_from = base.recorder().steps().size(), mixed_from = mixed.recorder().steps().size();
  const detail::KeepGlobalRng keep;  // the pair seeds the generator; the arms' branch points set it
  std::cout << "doctor: the fp32 arm replays beside the " << precision_name(o.precision()) << " run, "
            << at::get_num_threads() / 2 << " thread(s) each" << std::endl;
  if (!detail::fit_side_by_side(base, mixed, o, nullptr, {}, [&](Learner& learn) { replay_fit(learn, o, window); }))
    return false;
  ev.fp32 = window_evidence(base, base_from, "fp32");
  ev.mixed = window_evidence(mixed, mixed_from, precision_name(o.precision()));
  ev.side_by_side = true;
  return true;
}

} // namespace

Diagnosis compare_branch(const BranchFactory& at_branch, const CompareOptions& o, int64_t window) {
  TORCH_CHECK(o.precision() != Precision::kFp32, "diagnose::compare_branch: the run's precision must be a mixed one, got fp32");
  if (window < kMinCompareSteps)
    throw OptionError("window", "a window of " + std::to_string(window) + " step(s) is too short to judge; the comparison needs at least " +
                                    std::to_string(kMinCompareSteps));
  Evidence ev;
  ev.branched = true;
  detail::PhaseClock clock;
  const MixedRun own{o.precision(), o.precision_options(), 0};
  const bool traced = mode_of(o.precision()).traces_overflow;  // fp16 compute: overflow traced to its op
  std::unique_ptr<Learner> base = at_branch(Arm::kFp32, own);
  TORCH_CHECK(base, "diagnose::compare_branch: the branch factory returned nothing");
  ev.inputs = check_inputs(base->dls().train.dataset().x);
  ev.start_valid_loss = detail::start_valid_loss(*base);
  std::unique_ptr<Learner> mixed;
  std::optional<data::Batch> probe;
  const auto run_arm = [&] {
    mixed = at_branch(Arm::kRun, own);
    TORCH_CHECK(mixed, "diagnose::compare_branch: the branch factory returned nothing");
    probe = detail::probe_batch(*mixed);
    if (traced) {
      const detail::KeepGlobalRng keep;
      ev.trace_start = trace_overflow(*mixed, *probe);
    }
  };
  if (may_replay_side_by_side(*base, o)) {
    run_arm();
    clock.ends("setup");
    if (replay_side_by_side(*base, *mixed, o, window, ev)) {
      clock.ends("pair");
    } else {  // the arms train in turn, each built again from its branch point
      base = at_branch(Arm::kFp32, own);
      mixed.reset();
    }
  }
  if (!ev.side_by_side) {
    // In turn: each arm has its own phase.
    if (clock.empty()) clock.ends("setup");
    ev.fp32 = replay_window(*base, o, window, "fp32");
    base.reset();
    clock.ends("fp32");
    run_arm();
    clock.ends("run's setup");
    ev.mixed = replay_window(*mixed, o, window, precision_name(o.precision()));
    clock.ends("run");
  }
  base.reset();
  if (traced) {
    ev.trace_end = trace_overflow(*mixed, *probe);
    auto pc = mixed->precision_cb();
    ev.gradients = measure_gradients(*mixed, *probe, pc ? pc->loss_scale() : 1.0);
  }
  mixed.reset();
  Diagnosis d = decide(std::move(ev));
  clock.ends("after");
  d.timing = clock.phases();
  detail::report_progress(d, o);
  const detail::TrialRunner from_branch = [&](const MixedRun& t, std::string* next_overflow) {
    std::unique_ptr<Learner> learn = at_branch(Arm::kTrial, t);
    if (next_overflow) {
      const detail::KeepGlobalRng keep;
      *next_overflow = detail::first_overflow_island(*learn);
    }
    return replay_window(*learn, o, window, precision_name(t.precision));
  };
  detail::try_fixes(d, from_branch, o);
  clock.ends("trials");
  d.timing = clock.phases();
  return d;
}

} // namespace mixtrain::diagnose
