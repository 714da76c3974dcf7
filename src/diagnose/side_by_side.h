#pragma once
// Private: the fp32 baseline and the run under diagnosis trained side by side, each on half
// the intra-op threads (side_by_side.cpp), and the head start: the first trial of the verdict
// the run points to, begun on the baseline's thread once the baseline has ended.

#include "catalogue.h"
#include "evidence.h"
#include "trials.h"

#include "mixtrain/callbacks/progress.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/diagnose/compare.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain::diagnose::detail {

/// What keeps the baseline from training beside the mixed run ("" when nothing does):
/// only a pair that computes exactly what each arm would compute alone trains side by side.
/// `initial`: the model's state tensors, put back after the probe forward.
std::string why_not_side_by_side(Learner& baseline, const CompareOptions& o, const std::vector<torch::Tensor>& initial);

/// Whether two learners' models share a tensor (a factory that hands out one module twice).
bool share_tensors(Learner& a, Learner& b);

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

  HeadStartTrial(HeadStart what, MixedRun run, std::unique_ptr<Learner> learn, CompareOptions o)
      : what_(std::move(what)), run_(std::move(run)), learn_(std::move(learn)), o_(std::move(o)) {
    // Its lines would interleave with the run under diagnosis's.
    if (const auto progress = learn_->get_cb<callbacks::ProgressCallback>()) learn_->remove_cb(progress);
  }

  const HeadStart& what() const { return what_; }

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

  HeadStart what_;
  MixedRun run_;
  std::unique_ptr<Learner> learn_;
  CompareOptions o_;
  std::exception_ptr error_;
  bool kept_ = false;
  double seconds_ = 0;
};

/// Trains `baseline` on this thread while a second thread trains `run` (the run under
/// diagnosis), each on half the intra-op threads, from the seed just set; then puts the
/// thread count back. An error in either arm stops the other after its batch and is
/// rethrown (the run's first). When `head` is given and the baseline ends first, the
/// run is asked whether it is likely to get the head start's verdict; if so the head start
/// trains on this thread, and `keep` (called once `run` has ended) decides whether it goes on.
/// Returns false, having trained both, when the global generator moved after all (a draw
/// the probe forward did not make): the pair must train again, in turn.
/// `train`, when given, is how each arm trains instead of fit's schedule (a branch's window).
using TrainArm = std::function<void(Learner&)>;
bool fit_side_by_side(Learner& baseline, Learner& run, const CompareOptions& o, HeadStartTrial* head,
                      const HeadStartTrial::Keep& keep, const TrainArm& train = {});

} // namespace mixtrain::diagnose::detail
