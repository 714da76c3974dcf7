// The fp32 baseline and the run under diagnosis trained side by side (side_by_side.h): two
// threads, each on half the intra-op threads, an error in either stopping the other, and the
// head start on the baseline's thread once it has ended. This thread waits on the run's
// through a condition variable, calling the front end's stop check while it waits.
#include "side_by_side.h"

#include "mixtrain/core/callback.h"

#include <torch/torch.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace mixtrain::diagnose::detail {

namespace {

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
  restore_state(learn, initial);
  module.train(was_training);
  return drew;
}

} // namespace

std::string why_not_side_by_side(Learner& baseline, const CompareOptions& o, const std::vector<torch::Tensor>& initial) {
  if (!o.side_by_side()) return "not asked";
  if (at::get_num_threads() < 2) return "one intra-op thread";
  if (!baseline.device().is_cpu()) return "not on a CPU";
  for (const auto& cb : baseline.cbs())  // by name: the callback's header brings c10d's
    if (cb->name() == "DataParallel") return "a data-parallel group";
  if (forward_draws_random_numbers(baseline, initial)) return "the model draws random numbers";
  return "";
}

bool share_tensors(Learner& a, Learner& b) {
  std::unordered_set<const void*> mine;
  for (const auto& t : a.model().state_tensors()) mine.insert(t.data_ptr());
  for (const auto& t : b.model().state_tensors())
    if (mine.count(t.data_ptr())) return true;
  return false;
}

namespace {

/// Wakes this thread when the run's thread has something to say (it answered, or it ended).
struct Signal {
  std::mutex mutex;
  std::condition_variable changed;
  void notify() {
    { const std::lock_guard<std::mutex> lock(mutex); }  // a waiter that saw nothing yet is waiting now
    changed.notify_all();
  }
};

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

/// What the run under diagnosis answers once the baseline beside it has ended.
enum class HeadStartCall { kPending, kStart, kNo };

/// On the run under diagnosis, once the baseline has ended: asks the head start whether
/// the run so far is likely to get its verdict (HeadStart::likely), every kEvery batches
/// until it is, and answers through `call`; the baseline's thread waits for a yes, or for
/// the run's end.
class AskAboutTheHeadStart : public Callback {
 public:
  AskAboutTheHeadStart(const std::atomic<bool>* baseline_done, const HeadStart* head, std::atomic<HeadStartCall>* call,
                       Signal* answered)
      : baseline_done_(baseline_done), head_(head), call_(call), answered_(answered) {
    order = 100;  // after the Recorder and the precision callback have counted the step
  }
  std::string name() const override { return "AskAboutTheHeadStart"; }
  void after_batch(Learner& learn) override {
    if (call_->load() != HeadStartCall::kPending || !learn.training() || !baseline_done_->load(std::memory_order_acquire))
      return;
    if (batches_++ % kEvery != 0) return;
    if (head_->likely(summarize_steps(learn, 0, precision_name(learn.precision())))) {
      call_->store(HeadStartCall::kStart);
      answered_->notify();
    }
  }

 private:
  /// A question reduces every parameter once (the lost-update report): about 0.15 ms on
  /// doctor_bench's MLP, under a tenth of one of its steps on one thread.
  static constexpr int64_t kEvery = 4;
  int64_t batches_ = 0;
  const std::atomic<bool>* baseline_done_;
  const HeadStart* head_;
  std::atomic<HeadStartCall>* call_;
  Signal* answered_;
};

} // namespace

bool fit_side_by_side(Learner& baseline, Learner& run, const CompareOptions& o, HeadStartTrial* head,
                      const HeadStartTrial::Keep& keep, const TrainArm& train) {
  const auto train_arm = [&](Learner& learn) {
    if (train)
      train(learn);
    else
      fit(learn, o, /*seed=*/false);
  };
  const int threads = at::get_num_threads();
  const int half = threads / 2;
  std::atomic<bool> baseline_failed{false}, run_failed{false}, baseline_done{false}, run_ended{false};
  std::atomic<HeadStartCall> call{head ? HeadStartCall::kPending : HeadStartCall::kNo};
  Signal signal;  // the run answered or ended (outlives the worker: join_on_exit is declared after it)
  const auto stop_baseline = std::make_shared<StopWhenTheOtherArmFails>(&run_failed);
  const auto stop_run = std::make_shared<StopWhenTheOtherArmFails>(&baseline_failed);
  baseline.add_cb(stop_baseline);
  run.add_cb(stop_run);
  const CallbackPtr ask =
      head ? std::make_shared<AskAboutTheHeadStart>(&baseline_done, &head->what(), &call, &signal) : nullptr;
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
      train_arm(run);
    } catch (...) {
      run_error = std::current_exception();
      run_failed = true;
    }
    HeadStartCall unasked = HeadStartCall::kPending;  // the run ended before it answered
    call.compare_exchange_strong(unasked, HeadStartCall::kNo);
    run_ended.store(true, std::memory_order_release);
    signal.notify();
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
    train_arm(baseline);
  } catch (...) {
    baseline_error = std::current_exception();
    baseline_failed = true;
  }
  baseline_done.store(true, std::memory_order_release);
  // This thread waits on the run's, woken when it answers or ends; the front end's stop
  // check goes on meanwhile, every 20 ms.
  const auto wait_until = [&](const auto& done) {
    std::unique_lock<std::mutex> lock(signal.mutex);
    while (!done()) {
      if (signal.changed.wait_for(lock, std::chrono::milliseconds(20), done)) break;
      if (o.while_waiting()) {
        lock.unlock();
        o.while_waiting()();
        lock.lock();
      }
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

} // namespace mixtrain::diagnose::detail
