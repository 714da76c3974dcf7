#include "mixtrain/diagnose/compare.h"

#include "diagnose/catalogue.h"
#include "util/first_line.h"
#include "util/comma_list.h"
#include "util/short_number.h"

#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/amp/weight_update.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/callbacks/gradient_clip.h"
#include "mixtrain/callbacks/progress.h"
#include "mixtrain/callbacks/stop_on_request.h"
#include "mixtrain/diagnose/trial_stop.h"
#include "mixtrain/diagnose/gradient_health.h"
#include "mixtrain/diagnose/input_check.h"
#include "mixtrain/diagnose/overflow_trace.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/models/failure_site.h"
#include "mixtrain/util/option_error.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <thread>
#include <unordered_set>

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

namespace {
/// What the Recorder's steps from `from` on say, and what the mode counted: the part
/// a whole run and a replayed window share.
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
} // namespace

RunEvidence summarize_run(Learner& learn, const std::string& precision) {
  RunEvidence r = summarize_steps(learn, 0, precision);
  if (!learn.recorder().values().empty()) {
    const EpochRecord& last = learn.recorder().values().back();
    r.final_loss = last.train_loss;
    r.valid_loss = last.valid_loss;
    r.metrics = last.metrics;
  }
  return r;
}

namespace {

/// torch's global generator as it was, put back at the end of the scope: a diagnostic
/// pass (dropout) must not move the replay's random stream off the run's.
class KeepGlobalRng {
 public:
  KeepGlobalRng() : state_(at::detail::getDefaultCPUGenerator().get_state()) {}
  ~KeepGlobalRng() {
    at::Generator global = at::detail::getDefaultCPUGenerator();
    global.set_state(state_);
  }

 private:
  torch::Tensor state_;
};

void fit(Learner& learn, const CompareOptions& o, bool seed = true) {
  if (seed) torch::manual_seed(o.seed());  // dropout and anything else drawing from the global generator
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

/// Whether `learn`'s model draws from torch's global generator in a training forward
/// (dropout, stochastic depth): one forward of the probe batch, with the generator and
/// the model's state (BatchNorm's running statistics) put back after it. A forward that
/// fails counts as drawing: the runs then train in turn, and the baseline's fit reports it.
bool forward_draws_random_numbers(Learner& learn, const std::vector<torch::Tensor>& initial) {
  torch::nn::Module& module = learn.model().module();
  const bool was_training = module.is_training();
  const KeepGlobalRng keep;
  at::Generator global = at::detail::getDefaultCPUGenerator();
  const torch::Tensor before = global.get_state();
  bool drew = true;
  torch::NoGradGuard no_grad;
  try {
    module.train(true);
    const data::Batch probe = probe_batch(learn).to(learn.device());
    (void)learn.model().forward(learn.model().inputs_for(probe));
    drew = !torch::equal(global.get_state(), before);
  } catch (const std::exception&) {
  }
  const auto state = learn.model().state_tensors();
  for (size_t i = 0; i < state.size() && i < initial.size(); ++i) state[i].copy_(initial[i]);
  module.train(was_training);
  return drew;
}

/// What keeps the baseline from training beside the mixed run ("" when nothing does):
/// only a pair that computes exactly what each arm would compute alone trains side by side.
std::string why_not_side_by_side(Learner& baseline, const CompareOptions& o, const std::vector<torch::Tensor>& initial) {
  if (!o.side_by_side()) return "not asked";
  if (at::get_num_threads() < 2) return "one intra-op thread";
  if (!baseline.device().is_cpu()) return "not on a CPU";
  for (const auto& cb : baseline.cbs())  // by name: the callback's header brings c10d's
    if (cb->name() == "DataParallel") return "a data-parallel group";
  if (forward_draws_random_numbers(baseline, initial)) return "the model draws random numbers";
  return "";
}

/// Whether two learners' models share a tensor (a factory that hands out one module twice).
bool share_tensors(Learner& a, Learner& b) {
  std::unordered_set<const void*> mine;
  for (const auto& t : a.model().state_tensors()) mine.insert(t.data_ptr());
  for (const auto& t : b.model().state_tensors())
    if (mine.count(t.data_ptr())) return true;
  return false;
}

/// Ends a fit after the batch in progress once `*other_failed` is set: the other arm of
/// a side-by-side pair has thrown, and its error is what the caller will see.
class StopWhenTheOtherArmFails : public Callback {
 public:
  explicit StopWhenTheOtherArmFails(const std::atomic<bool>* other_failed) : other_failed_(other_failed) { order = 100; }
  std::string name() const override { return "StopWhenTheOtherArmFails"; }
  void after_batch(Learner&) override {
    if (other_failed_->load()) throw CancelFitException();
  }

 private:
  const std::atomic<bool>* other_failed_;
};

bool same_settings(const std::vector<Setting>& a, const std::vector<Setting>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const Setting& x, const Setting& y) { return x.key == y.key && x.value == y.value; });
}

/// The fixes `d`'s verdict would try, cheapest first (none when `o` runs no trials).
std::vector<Fix> trial_queue(const Diagnosis& d, const CompareOptions& o) {
  const detail::TrialsFor trials = detail::entry(d.verdict).trials;
  if (o.max_trials() <= 0 || !o.apply_setting() || !trials) return {};
  return trials(d, o);
}

/// The first trial of the verdict the run points to, started before the verdict: on this
/// thread, once the fp32 baseline has ended while the run under diagnosis still trains on
/// the other. When that run ends, the trial goes on with every thread if the verdict's
/// first trial is this one; else it stops at its next batch and is dropped. Its learner
/// is built before the pair trains: a factory draws initial weights from torch's global
/// generator, which nothing may move while the pair trains (compare() checks it did not).
/// It trains on this thread, not a third: libgomp throttles its spin-waiting once more
/// threads wait than there are CPUs, and a second thread's OpenMP team then ran a small
/// model's steps 3x slower than this thread's (2 cores, measured).
class HeadStartTrial {
 public:
  /// Whether the verdict, the run under diagnosis having ended, tries this trial first.
  using Keep = std::function<bool()>;

  HeadStartTrial(detail::HeadStart what, MixedRun run, std::unique_ptr<Learner> learn, CompareOptions o)
      : what_(std::move(what)), run_(std::move(run)), learn_(std::move(learn)), o_(std::move(o)) {
    // Its lines would interleave with the run under diagnosis's.
    if (const auto progress = learn_->get_cb<callbacks::ProgressCallback>()) learn_->remove_cb(progress);
  }

  const detail::HeadStart& what() const { return what_; }

  /// Trains it here on `threads` intra-op threads while the run under diagnosis trains;
  /// once `run_ended` is set, `end_run()` (which joins that run's thread) and `keep()`
  /// decide whether it goes on, on `all_threads`, or stops.
  void train(int threads, int all_threads, const std::atomic<bool>& run_ended, const std::function<void()>& end_run,
             const Keep& keep) {
    const auto control = std::make_shared<Control>(all_threads, run_ended, end_run, keep);
    learn_->add_cb(control);
    at::set_num_threads(threads);
    const auto start = std::chrono::steady_clock::now();
    try {
      fit(*learn_, o_, /*seed=*/false);  // the generator stands where the pair's seed left it
    } catch (...) {  // its own failure, reported when it is adopted as a trial
      error_ = std::current_exception();
    }
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    learn_->remove_cb(control);
    at::set_num_threads(all_threads);
    if (!control->decided()) {  // it ended before the run under diagnosis did
      end_run();
      kept_ = keep();
    } else {
      kept_ = control->kept();
    }
  }
  /// What it measured, as a trial runner returns it, or its error; nothing when it was not
  /// kept (never started, or stopped).
  std::optional<RunEvidence> result() {
    if (!kept_) return std::nullopt;
    if (error_) std::rethrow_exception(error_);
    return summarize_run(*learn_, precision_name(run_.precision));
  }
  bool kept() const { return kept_; }
  double seconds() const { return seconds_; }

 private:
  /// Between its batches: once the run under diagnosis has ended, go on on every
  /// thread, or stop.
  class Control : public Callback {
   public:
    Control(int all_threads, const std::atomic<bool>& run_ended, std::function<void()> end_run, Keep keep)
        : all_threads_(all_threads), run_ended_(run_ended), end_run_(std::move(end_run)), keep_(std::move(keep)) {
      order = 100;
    }
    std::string name() const override { return "HeadStartControl"; }
    void before_batch(Learner&) override {
      if (decided_ || !run_ended_.load(std::memory_order_acquire)) return;
      decided_ = true;
      end_run_();
      kept_ = keep_();
      if (!kept_) throw CancelFitException();
      at::set_num_threads(all_threads_);
    }
    bool decided() const { return decided_; }
    bool kept() const { return kept_; }

   private:
    int all_threads_;
    const std::atomic<bool>& run_ended_;
    std::function<void()> end_run_;
    Keep keep_;
    bool decided_ = false, kept_ = false;
  };

  detail::HeadStart what_;
  MixedRun run_;
  std::unique_ptr<Learner> learn_;
  CompareOptions o_;
  std::exception_ptr error_;
  bool kept_ = false;
  double seconds_ = 0;
};

/// What the run under diagnosis answers once the baseline beside it has ended.
enum class HeadStartCall { kPending, kStart, kNo };

/// On the run under diagnosis, once the baseline has ended: asks the head start whether
/// the run so far is likely to get its verdict (HeadStart::likely), every kEvery batches
/// until it is, and answers through `call`; the baseline's thread waits for a yes, or for
/// the run's end.
class AskAboutTheHeadStart : public Callback {
 public:
  AskAboutTheHeadStart(const std::atomic<bool>* baseline_done, const detail::HeadStart* head,
                       std::atomic<HeadStartCall>* call)
      : baseline_done_(baseline_done), head_(head), call_(call) {
    order = 100;  // after the Recorder and the precision callback have counted the step
  }
  std::string name() const override { return "AskAboutTheHeadStart"; }
  void after_batch(Learner& learn) override {
    if (call_->load() != HeadStartCall::kPending || !learn.training() || !baseline_done_->load(std::memory_order_acquire))
      return;
    if (batches_++ % kEvery != 0) return;
    if (head_->likely(summarize_steps(learn, 0, precision_name(learn.precision())))) call_->store(HeadStartCall::kStart);
  }

 private:
  /// A question reduces every parameter once (the lost-update report): about 0.15 ms on
  /// doctor_bench's MLP, under a tenth of one of its steps on one thread.
  static constexpr int64_t kEvery = 4;
  int64_t batches_ = 0;
  const std::atomic<bool>* baseline_done_;
  const detail::HeadStart* head_;
  std::atomic<HeadStartCall>* call_;
};

/// Trains `baseline` on this thread while a second thread trains `run` (the run under
/// diagnosis), each on half the intra-op threads, from the seed just set; then puts the
/// thread count back. An error in either arm stops the other after its batch and is
/// rethrown (the run's first). When `head` is given and the baseline ends first, the
/// run is asked whether it is likely to get the head start's verdict; if so the head start
/// trains on this thread, and `keep` (called once `run` has ended) decides whether it goes on.
/// Returns false, having trained both, when the global generator moved after all (a draw
/// the probe forward did not make): the pair must train again, in turn.
bool fit_side_by_side(Learner& baseline, Learner& run, const CompareOptions& o, HeadStartTrial* head,
                      const HeadStartTrial::Keep& keep) {
  const int threads = at::get_num_threads();
  const int half = threads / 2;
  std::atomic<bool> baseline_failed{false}, run_failed{false}, baseline_done{false}, run_ended{false};
  std::atomic<HeadStartCall> call{head ? HeadStartCall::kPending : HeadStartCall::kNo};
  const auto stop_baseline = std::make_shared<StopWhenTheOtherArmFails>(&run_failed);
  const auto stop_run = std::make_shared<StopWhenTheOtherArmFails>(&baseline_failed);
  baseline.add_cb(stop_baseline);
  run.add_cb(stop_run);
  const CallbackPtr ask =
      head ? std::make_shared<AskAboutTheHeadStart>(&baseline_done, &head->what(), &call) : nullptr;
  if (ask) run.add_cb(ask);
  // Only the run under diagnosis shows its progress: two arms' lines would interleave.
  const auto progress = baseline.get_cb<callbacks::ProgressCallback>();
  if (progress) baseline.remove_cb(progress);
  torch::manual_seed(o.seed());
  const torch::Tensor seeded = at::detail::getDefaultCPUGenerator().get_state();
  std::exception_ptr baseline_error, run_error;
  at::set_num_threads(threads - half);
  std::thread worker([&] {
    // Each thread has its own OpenMP thread count; this one's starts from torch's default.
    at::init_num_threads();
    at::set_num_threads(half);
    try {
      fit(run, o, /*seed=*/false);
    } catch (...) {
      run_error = std::current_exception();
      run_failed = true;
    }
    HeadStartCall unasked = HeadStartCall::kPending;  // the run ended before it answered
    call.compare_exchange_strong(unasked, HeadStartCall::kNo);
    run_ended.store(true, std::memory_order_release);
  });
  // Whatever this thread throws, the run stops after its batch and is waited for.
  struct JoinOnExit {
    std::thread& worker;
    std::atomic<bool>& stop;
    ~JoinOnExit() {
      if (!worker.joinable()) return;
      stop = true;
      worker.join();
    }
  } join_on_exit{worker, baseline_failed};
  try {
    fit(baseline, o, /*seed=*/false);
  } catch (...) {
    baseline_error = std::current_exception();
    baseline_failed = true;
  }
  baseline_done.store(true, std::memory_order_release);
  // This thread waits on the run's; the front end's stop check goes on meanwhile.
  const auto wait_until = [&](const auto& done) {
    for (int i = 1; !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (i % 20 == 0 && o.while_waiting()) o.while_waiting()();
    }
  };
  bool joined = false;
  const auto end_run = [&] {
    if (joined) return;
    wait_until([&] { return run_ended.load(std::memory_order_acquire); });
    worker.join();
    joined = true;
  };
  if (head && !baseline_error) {
    // The run answers at its next batch (or by ending).
    wait_until([&] { return call.load() != HeadStartCall::kPending; });
    const HeadStartCall answer = call.load();
    // Nothing printed here: the run's progress lines are being written on the other thread.
    // Kept only from a sound pair: the run did not fail, and nothing drew from the generator.
    const auto sound = [&] { return !run_error && torch::equal(at::detail::getDefaultCPUGenerator().get_state(), seeded); };
    if (answer == HeadStartCall::kStart) head->train(half, threads, run_ended, end_run, [&] { return sound() && keep(); });
  }
  end_run();
  at::set_num_threads(threads);
  baseline.remove_cb(stop_baseline);
  run.remove_cb(stop_run);
  if (ask) run.remove_cb(ask);
  if (progress) baseline.add_cb(progress);
  if (run_error) std::rethrow_exception(run_error);
  if (baseline_error) std::rethrow_exception(baseline_error);
  return torch::equal(at::detail::getDefaultCPUGenerator().get_state(), seeded);
}

/// Runs the mixed run again as a trial's settings make it and returns what it measured;
/// `next_overflow` (when given) receives the module where its forward pass still
/// overflows, if any. From scratch: the same initial weights, seed and data order; from
/// a branch: the same checkpoint and window.
using TrialRunner = std::function<RunEvidence(const MixedRun& run, std::string* next_overflow)>;

/// Where the forward pass of `learn` first overflows on the probe batch ("" when nowhere).
std::string first_overflow_island(Learner& learn) {
  const OverflowTrace trace = trace_overflow(learn, probe_batch(learn));
  return trace.first_overflow ? trace.first_overflow->island() : std::string();
}

/// The mixed run again with `c`'s settings, judged against the baseline by the
/// verdict's rules (finite losses, skips, the gap; no traces: what the trial itself did decides).
/// The mixed run as fix `c`'s settings make it.
MixedRun run_with(const CompareOptions& o, const Fix& c) {
  MixedRun t{o.precision(), o.precision_options(), 0};
  for (const auto& st : c.settings) o.apply_setting()(st, t);
  return t;
}

/// The validation loss of `learn`'s weights as they are (fp32, before it trains): the one
/// point both arms start from. NaN when there is no validation set.
double start_valid_loss(Learner& learn) {
  if (learn.dls().valid.num_batches() == 0) return std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v = learn.validate();
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : v[0];
}

Trial run_trial(const TrialRunner& runner, const CompareOptions& o, const Evidence& measured, const Fix& c,
                std::string* next_overflow) {
  const MixedRun t = run_with(o, c);
  const auto start = std::chrono::steady_clock::now();
  Trial r;
  r.fix = c.fix;
  r.settings = c.settings;
  r.run = runner(t, t.precision == Precision::kFp16 ? next_overflow : nullptr);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Evidence e;
  e.fp32 = measured.fp32;
  e.mixed = r.run;
  e.branched = measured.branched;
  e.start_valid_loss = measured.start_valid_loss;
  r.finite = r.run.scale.nonfinite_losses == 0 && std::isfinite(r.run.final_loss);
  r.skipped = r.run.scale.skipped;
  r.gap_percent = e.gap_percent();
  r.verdict = decide(std::move(e)).verdict;
  return r;
}

/// A fix whose own trial could not run on this model is not recommended: it moves
/// from the fixes to the findings, with the trial's error. (A fix names a trial when
/// it names the trial's first setting, the one that defines it.)
void withdraw_failed_fixes(Diagnosis& d) {
  std::vector<Phrase> kept;
  for (const Phrase& fix : d.fixes) {
    const Trial* failed = nullptr;
    bool ran = false;
    for (const Trial& t : d.trials) {
      if (t.settings.empty() || !fix.names_setting(t.settings[0].key, t.settings[0].value)) continue;
      if (t.error.empty())
        ran = true;
      else if (!failed)
        failed = &t;
    }
    if (failed && !ran)
      d.findings.push_back("not recommended: " + fix + "; its trial failed on this model: " + failed->error);
    else
      kept.push_back(fix);
  }
  d.fixes = std::move(kept);
}

/// What the trials so far prove: failed fixes withdrawn, and the proven fix chosen.
void settle(Diagnosis& d) {
  withdraw_failed_fixes(d);
  // The proven fix: the cheapest healthy trial in bytes per parameter; among equally
  // cheap ones (the autocast modes all cost the same) the first tried, the most targeted,
  // unless another's gap to fp32 is smaller by more than noise. Gaps a fraction of a
  // percent apart are rounding noise and would make the choice depend on the CPU (real
  // bf16 kernels or their emulation).
  auto cost = [](const Trial& t) { return std::isfinite(t.run.bytes_per_param) ? t.run.bytes_per_param : 1e300; };
  auto gap = [](const Trial& t) { return t.gap_percent ? std::abs(*t.gap_percent) : 0.0; };
  for (size_t i = 0; i < d.trials.size(); ++i) {
    const Trial& t = d.trials[i];
    if (!t.proven()) continue;
    if (!d.proven_fix) {
      d.proven_fix = i;
      continue;
    }
    const Trial& best = d.trials[*d.proven_fix];
    if (cost(t) < cost(best) - 1e-9 || (std::abs(cost(t) - cost(best)) <= 1e-9 && gap(t) < gap(best) - kGapNoisePercent))
      d.proven_fix = i;
  }
}

/// Hands the caller what is known so far: the verdict and the trials that ended.
void report_progress(const Diagnosis& d, const CompareOptions& o) {
  if (!o.on_progress()) return;
  Diagnosis now = d;
  settle(now);
  now.trials_status = "running";
  o.on_progress()(now);
}

/// Runs the verdict's trials, cheapest first, until one is proven that no waiting fix
/// could beat or the budget ends. A head start the verdict kept is its first trial.
void try_fixes(Diagnosis& d, const TrialRunner& runner, const CompareOptions& o, HeadStartTrial* head = nullptr) {
  std::vector<Fix> queue = trial_queue(d, o);
  const bool adopt = head && head->kept() && !queue.empty() && same_settings(queue[0].settings, head->what().fix.settings);
  bool head_trained = false;
  const TrialRunner head_runner = [&](const MixedRun& t, std::string* next_overflow) {
    if (std::optional<RunEvidence> r = head->result()) {
      head_trained = true;
      return *r;
    }
    return runner(t, next_overflow);
  };
  // Islands grow while a trial still overflows elsewhere, up to the trial budget.
  for (size_t i = 0; i < queue.size() && static_cast<int64_t>(d.trials.size()) < o.max_trials(); ++i) {
    const Fix c = queue[i];
    const bool island = !c.settings.empty() && c.settings[0].key == "keep_fp32";
    std::string next;
    const bool early = adopt && i == 0;
    std::cout << "doctor: trial " << d.trials.size() + 1 << ": " << c.fix.str()
              << (early ? " (trained before the verdict, after the fp32 baseline)" : "") << std::endl;
    try {
      d.trials.push_back(run_trial(early ? head_runner : runner, o, d.evidence, c, island ? &next : nullptr));
      if (early && head_trained) {
        d.trials.back().seconds = head->seconds();
        d.trials.back().head_start = true;
      }
    } catch (const callbacks::StopRequested&) {  // the user's stop is not a failed trial
      throw;
    } catch (const std::exception& e) {  // a fix this model cannot take: the trial failed, and says why
      Trial failed;
      failed.fix = c.fix;
      failed.settings = c.settings;
      failed.error = innermost_message(e);
      failed.verdict = d.verdict;
      d.trials.push_back(std::move(failed));
      std::cout << "doctor: trial failed: " << d.trials.back().error << std::endl;
      report_progress(d, o);
      continue;
    }
    report_progress(d, o);
    const Trial& t = d.trials.back();
    const double run_bytes = d.evidence.mixed ? d.evidence.mixed->bytes_per_param : NAN;
    const std::vector<Fix> waiting(queue.begin() + static_cast<std::ptrdiff_t>(i) + 1, queue.end());
    d.trials_stopped = why_trials_stop(t, run_bytes, waiting);
    if (!d.trials_stopped.empty()) break;
    if (island && !t.proven() && !next.empty()) {
      std::vector<std::string> names = mixtrain::detail::comma_list(c.settings[0].value);
      if (std::find(names.begin(), names.end(), next) == names.end()) {
        names.push_back(next);
        const std::string islands = mixtrain::detail::comma_joined(names);
        queue.insert(queue.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                     Fix{"keep " + islands + " in fp32", {{"keep_fp32", islands}}});
      }
    }
  }
  settle(d);
}

} // namespace

Diagnosis compare(const LearnerFactory& make_learner, const CompareOptions& o) {
  TORCH_CHECK(mode_of(o.precision()).doctor_compares,
              "diagnose::compare: precision must be fp16, bf16 or bf16-pure, got ", precision_name(o.precision()));
  TORCH_CHECK(o.epochs() >= 1, "diagnose::compare: epochs must be >= 1, got ", o.epochs());
  Evidence ev;
  const bool fp16 = o.precision() == Precision::kFp16;
  std::vector<std::pair<std::string, double>> timing;
  auto phase_start = std::chrono::steady_clock::now();
  const auto phase_ends = [&](const char* phase) {
    const auto now = std::chrono::steady_clock::now();
    timing.emplace_back(phase, std::chrono::duration<double>(now - phase_start).count());
    phase_start = now;
  };

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
  try {
    amp::check_precision_supported(compute_dtype(o.precision()), baseline->device(),
                                   o.precision_options().allow_fp16_emulation());
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
  // Where both arms start, on the validation set: each arm's progress is measured from it.
  ev.start_valid_loss = start_valid_loss(*baseline);

  // The run under diagnosis: a second model from the factory, from the same weights.
  const auto make_mixed = [&] {
    torch::manual_seed(o.seed());
    std::unique_ptr<Learner> learn = make_learner();
    TORCH_CHECK(learn, "diagnose::compare: the learner factory returned nothing");
    const auto state = learn->model().state_tensors();
    TORCH_CHECK(state.size() == initial.size(), "diagnose::compare: the learner factory built two different models");
    for (size_t i = 0; i < state.size(); ++i) state[i].copy_(initial[i]);
    learn->set_precision(o.precision(), o.precision_options());
    return learn;
  };
  // A trial as the factory builds it, from the same weights: seeded as the runs were.
  const auto make_trial_learner = [&](const MixedRun& t) {
    torch::manual_seed(o.seed());
    std::unique_ptr<Learner> learn = make_learner();
    {
      const auto state = learn->model().state_tensors();
      for (size_t i = 0; i < state.size() && i < initial.size(); ++i) state[i].copy_(initial[i]);
    }
    learn->set_precision(t.precision, t.options);
    if (t.clip > 0) learn->add_cb(std::make_shared<callbacks::GradientClip>(t.clip));
    return learn;
  };
  std::unique_ptr<HeadStartTrial> head;
  std::unique_ptr<Learner> mixed;
  std::optional<OverflowTrace> trace_start;
  // bf16 has fp32's exponent range: there is no fp16 overflow to trace.
  const auto trace_start_of = [&](Learner& learn) {
    if (fp16) trace_start = trace_overflow(learn, probe_batch(learn));
  };
  if (why_not_side_by_side(*baseline, o, initial).empty()) {
    mixed = make_mixed();
    if (!share_tensors(*baseline, *mixed)) {
      trace_start_of(*mixed);
      // Built now, before the seed the pair trains from (a factory draws initial weights).
      if (const std::optional<detail::HeadStart> h = o.head_start() ? detail::head_start(o) : std::nullopt) {
        const MixedRun t = run_with(o, h->fix);
        std::unique_ptr<Learner> learn = make_trial_learner(t);
        if (!share_tensors(*learn, *mixed) && !share_tensors(*learn, *baseline))
          head = std::make_unique<HeadStartTrial>(*h, t, std::move(learn), o);
      }
      std::cout << "doctor: the fp32 baseline trains beside the " << precision_name(o.precision()) << " run, "
                << at::get_num_threads() / 2 << " thread(s) each" << std::endl;
      phase_ends("setup");
      // Once the run has ended (a head start still training): the verdict, handed to the
      // caller as it would be before any trial (bf16-pure only, whose evidence has no
      // overflow trace), and whether it tries the head start first.
      const HeadStartTrial::Keep keep = [&] {
        Evidence e = ev;
        e.fp32 = summarize_run(*baseline, "fp32");
        e.mixed = summarize_run(*mixed, precision_name(o.precision()));
        e.side_by_side = true;
        const Diagnosis verdict = decide(std::move(e));
        report_progress(verdict, o);
        const std::vector<Fix> queue = trial_queue(verdict, o);
        return !queue.empty() && same_settings(queue.front().settings, head->what().fix.settings);
      };
      ev.side_by_side = fit_side_by_side(*baseline, *mixed, o, head.get(), keep);
      if (!ev.side_by_side) {  // a draw the probe did not see: the pair trains again, in turn
        head.reset();
        std::cout << "doctor: the model drew random numbers while training; both runs train again, in turn" << std::endl;
        torch::manual_seed(o.seed());
        baseline = make_learner();
        const auto state = baseline->model().state_tensors();
        for (size_t i = 0; i < state.size() && i < initial.size(); ++i) state[i].copy_(initial[i]);
        mixed.reset();
      }
    } else {
      mixed.reset();
    }
  }
  if (ev.side_by_side) {
    ev.fp32 = summarize_run(*baseline, "fp32");
  } else {
    if (timing.empty()) phase_ends("setup");
    fit(*baseline, o);
    ev.fp32 = summarize_run(*baseline, "fp32");
    mixed = make_mixed();
    trace_start_of(*mixed);
    fit(*mixed, o);
  }
  phase_ends("pair");
  ev.trace_start = std::move(trace_start);
  const data::Batch probe = probe_batch(*mixed);
  ev.mixed = summarize_run(*mixed, precision_name(o.precision()));
  if (fp16) {
    ev.trace_end = trace_overflow(*mixed, probe);
    auto pc = mixed->precision_cb();
    ev.gradients = measure_gradients(*mixed, probe, pc ? pc->loss_scale() : 1.0);
  }
  Diagnosis d = decide(std::move(ev));
  phase_ends("after");
  d.timing = timing;
  report_progress(d, o);  // the verdict is kept before any trial can die or be stopped
  const TrialRunner from_scratch = [&](const MixedRun& t, std::string* next_overflow) {
    std::unique_ptr<Learner> learn = make_trial_learner(t);
    if (next_overflow) *next_overflow = first_overflow_island(*learn);
    fit(*learn, o);
    return summarize_run(*learn, precision_name(t.precision));
  };
  try_fixes(d, from_scratch, o, head.get());
  phase_ends("trials");
  d.timing = timing;
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
/// restored checkpoint), then validates: the window's evidence.
RunEvidence replay_window(Learner& learn, const CompareOptions& o, int64_t window, const std::string& precision) {
  const size_t from = learn.recorder().steps().size();
  if (auto pc = learn.precision_cb()) pc->restart_lost_updates();
  std::vector<CallbackPtr> stop{std::make_shared<StopAfterSteps>(window)};
  if (o.one_cycle())
    learn.fit_one_cycle(o.epochs(), o.lr(), OneCycleOptions(), stop);
  else
    learn.fit(o.epochs(), o.lr(), stop);
  RunEvidence r = summarize_steps(learn, from, precision);
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

} // namespace

Diagnosis compare_branch(const BranchFactory& at_branch, const CompareOptions& o, int64_t window) {
  TORCH_CHECK(o.precision() != Precision::kFp32, "diagnose::compare_branch: the run's precision must be a mixed one, got fp32");
  if (window < kMinCompareSteps)
    throw OptionError("window", "a window of " + std::to_string(window) + " step(s) is too short to judge; the comparison needs at least " +
                                    std::to_string(kMinCompareSteps));
  Evidence ev;
  ev.branched = true;
  const MixedRun own{o.precision(), o.precision_options(), 0};
  {
    std::unique_ptr<Learner> base = at_branch(Arm::kFp32, own);
    TORCH_CHECK(base, "diagnose::compare_branch: the branch factory returned nothing");
    ev.inputs = check_inputs(base->dls().train.dataset().x);
    ev.start_valid_loss = start_valid_loss(*base);
    ev.fp32 = replay_window(*base, o, window, "fp32");
  }
  std::unique_ptr<Learner> mixed = at_branch(Arm::kRun, own);
  TORCH_CHECK(mixed, "diagnose::compare_branch: the branch factory returned nothing");
  const bool fp16 = compute_dtype(o.precision()) == torch::kHalf;
  const data::Batch probe = probe_batch(*mixed);
  if (fp16) {
    const KeepGlobalRng keep;
    ev.trace_start = trace_overflow(*mixed, probe);
  }
  ev.mixed = replay_window(*mixed, o, window, precision_name(o.precision()));
  if (fp16) {
    ev.trace_end = trace_overflow(*mixed, probe);
    auto pc = mixed->precision_cb();
    ev.gradients = measure_gradients(*mixed, probe, pc ? pc->loss_scale() : 1.0);
  }
  mixed.reset();
  Diagnosis d = decide(std::move(ev));
  report_progress(d, o);
  const TrialRunner from_branch = [&](const MixedRun& t, std::string* next_overflow) {
    std::unique_ptr<Learner> learn = at_branch(Arm::kTrial, t);
    if (next_overflow) {
      const KeepGlobalRng keep;
      *next_overflow = first_overflow_island(*learn);
    }
    return replay_window(*learn, o, window, precision_name(t.precision));
  };
  try_fixes(d, from_branch, o);
  return d;
}

} // namespace mixtrain::diagnose
