// The doctor's fp32 baseline trained beside the run under diagnosis on a second thread,
// each on half the intra-op threads (CompareOptions::side_by_side): each arm must compute
// exactly what it computes alone on that many threads, or the pair trains in turn. And
// the head start: lost_updates' first trial trained on the baseline's threads before the
// verdict, kept as the first trial when the verdict agrees, else dropped.
#include "test_util.h"

#include <mixtrain/mixtrain.h>
#include <mixtrain/run/commands.h>
#include <mixtrain/run/doctor.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

using namespace mixtrain;
namespace nn = torch::nn;

/// stem -> BatchNorm -> (Dropout) -> head: BatchNorm's running statistics are state a
/// probe forward would move, Dropout draws from torch's global generator.
struct PairNetImpl : nn::Module {
  explicit PairNetImpl(double dropout)
      : stem(register_module("stem", nn::Linear(4, 32))),
        norm(register_module("norm", nn::BatchNorm1d(32))),
        drop(register_module("drop", nn::Dropout(dropout))),
        head(register_module("head", nn::Linear(32, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return head(drop(torch::relu(norm(stem(x))))); }
  nn::Linear stem;
  nn::BatchNorm1d norm;
  nn::Dropout drop;
  nn::Linear head;
};
TORCH_MODULE(PairNet);

struct PairSetup {
  double dropout = 0;
  LossFn loss = cross_entropy();
  /// Called with each Learner the factory builds and its index (0: the baseline).
  std::function<void(Learner&, int)> on_build = [](Learner&, int) {};
};

diagnose::LearnerFactory pair_factory(const PairSetup& s) {
  auto built = std::make_shared<int>(0);
  return [s, built] {
    PairNet net(s.dropout);
    auto dls = data::DataLoaders::from_split({test::blobs(512, 3, 4, 1), test::blobs(128, 3, 4, 2)}, 32, /*seed=*/7);
    auto learn = std::make_unique<Learner>(Model(net), std::move(dls), s.loss, LearnerOptions().progress(false));
    s.on_build(*learn, (*built)++);
    return learn;
  };
}

diagnose::CompareOptions pair_options() {
  return diagnose::CompareOptions().epochs(2).lr(1e-2).max_trials(0).precision(Precision::kBf16Pure).side_by_side(true);
}

/// compare() on `threads` intra-op threads; the count is expected back afterwards.
diagnose::Diagnosis compare_pair_on(int threads, const PairSetup& s, const diagnose::CompareOptions& o) {
  torch::set_num_threads(threads);
  auto d = diagnose::compare(pair_factory(s), o);
  EXPECT_EQ(torch::get_num_threads(), threads) << "the thread count was not put back";
  torch::set_num_threads(1);
  return d;
}

void expect_same_pair_evidence(const diagnose::Diagnosis& a, const diagnose::Diagnosis& b) {
  ASSERT_TRUE(a.evidence.fp32 && b.evidence.fp32 && a.evidence.mixed && b.evidence.mixed);
  EXPECT_EQ(a.evidence.fp32->losses, b.evidence.fp32->losses);
  EXPECT_EQ(a.evidence.fp32->valid_loss, b.evidence.fp32->valid_loss);
  EXPECT_EQ(a.evidence.mixed->losses, b.evidence.mixed->losses);
  EXPECT_EQ(a.evidence.mixed->valid_loss, b.evidence.mixed->valid_loss);
  EXPECT_EQ(a.verdict, b.verdict);
}

class CompareSideBySideTest : public test::SeededTest {};

// Two threads: each arm on one, side by side, bit for bit what the two compute in turn on
// one thread each; on both bf16 paths (the emulation, whose state is per thread and must
// not reach the fp32 baseline, and the CPU's own bf16 kernels under autocast).
TEST_F(CompareSideBySideTest, EachArmComputesExactlyWhatItComputesAloneOnHalfTheThreads) {
  for (const char* real_bf16 : {"0", "1"}) {
    SCOPED_TRACE(std::string("MIXTRAIN_CPU_BF16=") + real_bf16);
    ::setenv("MIXTRAIN_CPU_BF16", real_bf16, 1);
    const auto in_turn = compare_pair_on(1, PairSetup{}, pair_options());
    EXPECT_FALSE(in_turn.evidence.side_by_side);  // one thread: nothing to split
    const auto beside = compare_pair_on(2, PairSetup{}, pair_options());
    EXPECT_TRUE(beside.evidence.side_by_side);
    expect_same_pair_evidence(beside, in_turn);
    EXPECT_EQ(beside.evidence.mixed->emulated, std::string(real_bf16) == "0");
    ::unsetenv("MIXTRAIN_CPU_BF16");
  }
  EXPECT_FALSE(compare_pair_on(2, PairSetup{}, pair_options().side_by_side(false)).evidence.side_by_side);
  EXPECT_FALSE(diagnose::CompareOptions().side_by_side());  // the library's compare() only when asked
}

// Dropout draws from torch's one global generator: beside each other the arms would take
// each other's draws. The probe forward sees it; the runs train in turn, and the probe
// leaves the generator and BatchNorm's statistics as they were.
TEST_F(CompareSideBySideTest, AModelThatDrawsRandomNumbersTrainsItsRunsInTurn) {
  PairSetup dropout;
  dropout.dropout = 0.3;
  const auto probed = compare_pair_on(2, dropout, pair_options());
  EXPECT_FALSE(probed.evidence.side_by_side);
  expect_same_pair_evidence(probed, compare_pair_on(2, dropout, pair_options().side_by_side(false)));
}

// A draw the probe forward cannot see (here in the loss) moves the generator during the
// pair's training: both train again, in turn, and the evidence is the runs' in turn.
TEST_F(CompareSideBySideTest, ADrawOnlyTheTrainingMakesSendsThePairBackToTrainInTurn) {
  PairSetup noisy;
  noisy.loss = [](const torch::Tensor& pred, const torch::Tensor& y) {
    return torch::nn::functional::cross_entropy(pred + 1e-3 * torch::rand_like(pred), y);
  };
  const auto retried = compare_pair_on(2, noisy, pair_options());
  EXPECT_FALSE(retried.evidence.side_by_side);
  expect_same_pair_evidence(retried, compare_pair_on(2, noisy, pair_options().side_by_side(false)));
}

// An error in the arm on the second thread stops the other arm and is what compare()
// throws, with the thread count put back; so is an error in this thread's arm.
TEST_F(CompareSideBySideTest, AnErrorInEitherArmIsRethrownAndStopsTheOther) {
  struct FailAfter : Callback {
    int64_t seen = 0;
    void after_batch(Learner& learn) override {
      if (learn.training() && ++seen == 3) throw std::runtime_error("arm failed at its third batch");
    }
  };
  for (const int failing : {0, 1}) {  // 0: the baseline, on this thread; 1: the run, on the second
    PairSetup s;
    s.on_build = [failing](Learner& learn, int index) {
      if (index == failing) learn.add_cb(std::make_shared<FailAfter>());
    };
    torch::set_num_threads(2);
    EXPECT_THROW_WITH(diagnose::compare(pair_factory(s), pair_options()), "arm failed at its third batch");
    EXPECT_EQ(torch::get_num_threads(), 2) << "arm " << failing;
    torch::set_num_threads(1);
  }
}

using Flag = std::shared_ptr<std::atomic<bool>>;

/// Raises `flag` when its Learner's fit ends.
struct RaiseAtFitEnd : Callback {
  explicit RaiseAtFitEnd(Flag f) : flag(std::move(f)) {}
  void after_fit(Learner&) override { *flag = true; }
  Flag flag;
};

/// Holds its Learner until `flag` is up (or `limit` has passed): before its fit when
/// `after_batches` is 0, else after that many training batches. Counts the batches.
struct HoldUntil : Callback {
  HoldUntil(Flag f, int64_t after, std::chrono::seconds lim = std::chrono::seconds(600))
      : flag(std::move(f)), after_batches(after), limit(lim) {}
  void before_fit(Learner&) override {
    if (after_batches == 0) hold();
  }
  void after_batch(Learner& learn) override {
    if (learn.training() && ++*batches == after_batches) hold();
  }
  void hold() const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!*flag && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Flag flag;
  int64_t after_batches;
  std::chrono::seconds limit;
  std::shared_ptr<std::atomic<int64_t>> batches = std::make_shared<std::atomic<int64_t>>(0);
};

// While this thread waits for the run on the other, it calls while_waiting every few ms:
// a front end's stop check that only its main thread can make (Python's signal handlers)
// stops the run there.
TEST_F(CompareSideBySideTest, WhileItWaitsForTheRunTheCallingThreadChecksForAStop) {
  // The run holds at its first batch until a stop is asked (10 s at most: then it trains
  // on, and the test fails for want of a stop).
  auto requested = std::make_shared<std::atomic<bool>>(false);
  PairSetup s;
  s.on_build = [requested](Learner& learn, int index) {
    if (index == 1) learn.add_cb(std::make_shared<HoldUntil>(requested, 1, std::chrono::seconds(10)));
    learn.add_cb(std::make_shared<callbacks::StopOnRequest>(requested.get()));
  };
  int calls = 0;
  const auto ask_to_stop = [&calls, requested] {
    ++calls;
    *requested = true;
  };
  torch::set_num_threads(2);
  EXPECT_THROW(diagnose::compare(pair_factory(s), pair_options().while_waiting(ask_to_stop)), callbacks::StopRequested);
  EXPECT_GE(calls, 1);
  EXPECT_EQ(torch::get_num_threads(), 2);
  torch::set_num_threads(1);
}

// ---- The head start: lost_updates' first trial, trained on the baseline's threads ----

/// Holds the run under diagnosis at its first batch until the baseline has ended: the
/// baseline ends first however the two threads are scheduled (in turn it already has).
/// Learners 0 (the baseline) and 1 (the run under diagnosis) get their callback.
void baseline_ends_first(Learner& learn, int index, const Flag& baseline_ended) {
  if (index == 0) learn.add_cb(std::make_shared<RaiseAtFitEnd>(baseline_ended));
  if (index == 1) learn.add_cb(std::make_shared<HoldUntil>(baseline_ended, 1));
}

/// The new user's case in small: a LayerNorm MLP in bf16-pure at lr 2e-4 (lost_updates,
/// stochastic rounding proven by the first trial). `on_build` sees each Learner the
/// factory builds and its index: 0 the baseline, 1 the run, 2 the head start or, in
/// turn, the first trial.
diagnose::LearnerFactory lost_updates_factory(const std::function<void(Learner&, int)>& on_build) {
  auto built = std::make_shared<int>(0);
  return [on_build, built] {
    test::NormMlp net;
    auto dls = data::DataLoaders::from_split({test::blobs(512, 3, 8, 3), test::blobs(128, 3, 8, 4)}, 32, 11);
    auto learn = std::make_unique<Learner>(Model(net), std::move(dls), cross_entropy(), LearnerOptions().progress(false));
    on_build(*learn, (*built)++);
    return learn;
  };
}

diagnose::CompareOptions lost_updates_options() {
  return diagnose::CompareOptions()
      .epochs(3)
      .lr(2e-4)
      .one_cycle(false)
      .precision(Precision::kBf16Pure)
      .max_trials(2)
      .apply_setting(run::apply_setting)
      .side_by_side(true)
      .head_start(true);
}

struct Doctored {
  diagnose::Diagnosis d;
  std::string out;  ///< what it printed
};

Doctored doctor_on(int threads, const std::function<void(Learner&, int)>& on_build, bool side_by_side = true,
                   bool head_start = true) {
  const auto baseline_ended = std::make_shared<std::atomic<bool>>(false);
  const auto hooks = [baseline_ended, on_build](Learner& learn, int index) {
    baseline_ends_first(learn, index, baseline_ended);
    on_build(learn, index);
  };
  torch::set_num_threads(threads);
  ::testing::internal::CaptureStdout();
  Doctored r{diagnose::compare(lost_updates_factory(hooks),
                               lost_updates_options().side_by_side(side_by_side).head_start(head_start)),
             ""};
  r.out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(torch::get_num_threads(), threads) << "the thread count was not put back";
  torch::set_num_threads(1);
  return r;
}

/// The same trials, in the same order; the first `bitwise` bit for bit (a trial after
/// the pair trains on every thread, which in turn on one thread need not round alike).
void expect_same_trials(const diagnose::Diagnosis& a, const diagnose::Diagnosis& b, size_t bitwise = SIZE_MAX) {
  ASSERT_EQ(a.trials.size(), b.trials.size());
  for (size_t i = 0; i < a.trials.size(); ++i) {
    SCOPED_TRACE("trial " + std::to_string(i + 1));
    EXPECT_EQ(a.trials[i].fix.str(), b.trials[i].fix.str());
    EXPECT_EQ(a.trials[i].error, b.trials[i].error);
    if (i >= bitwise) continue;
    EXPECT_EQ(a.trials[i].run.losses, b.trials[i].run.losses);
    EXPECT_TRUE(a.trials[i].run.valid_loss == b.trials[i].run.valid_loss ||
                (std::isnan(a.trials[i].run.valid_loss) && std::isnan(b.trials[i].run.valid_loss)));
    EXPECT_EQ(a.trials[i].verdict, b.trials[i].verdict);
  }
  if (bitwise == SIZE_MAX) EXPECT_EQ(a.proven_fix, b.proven_fix);
}

// Once the baseline has ended and the run has lost a quarter of its updates, stochastic
// rounding trains on the baseline's thread before the verdict; the verdict agrees, and
// that trial is the doctor's first. Held here until the run has ended, it takes every
// thread from its first step, and is then bit for bit the trial in turn on every thread
// (the pair: each arm what it computes alone on one), on both bf16 paths. Unheld, its
// steps before the run's end take half the threads (the CPU's own bf16 kernels round
// differently on 1 and 2 threads, so that step would show in its last digits).
TEST_F(CompareSideBySideTest, AHeadStartTheVerdictAgreesWithIsItsFirstTrialBitForBit) {
  for (const char* real_bf16 : {"0", "1"}) {
    SCOPED_TRACE(std::string("MIXTRAIN_CPU_BF16=") + real_bf16);
    ::setenv("MIXTRAIN_CPU_BF16", real_bf16, 1);
    auto ended = std::make_shared<std::atomic<bool>>(false);
    const auto hold = [ended](Learner& learn, int index) {
      if (index == 1) learn.add_cb(std::make_shared<RaiseAtFitEnd>(ended));
      if (index == 2) learn.add_cb(std::make_shared<HoldUntil>(ended, 0));
    };
    const Doctored pair_in_turn = doctor_on(1, hold);
    *ended = false;
    const Doctored trials_in_turn = doctor_on(2, hold, /*side_by_side=*/false);
    *ended = false;
    const Doctored beside = doctor_on(2, hold);
    ::unsetenv("MIXTRAIN_CPU_BF16");
    ASSERT_EQ(pair_in_turn.d.verdict, diagnose::Verdict::kLostUpdates) << pair_in_turn.d.report();
    ASSERT_TRUE(beside.d.evidence.side_by_side);
    EXPECT_FALSE(trials_in_turn.d.evidence.side_by_side);
    expect_same_pair_evidence(beside.d, pair_in_turn.d);
    ASSERT_FALSE(beside.d.trials.empty()) << beside.d.report();
    EXPECT_TRUE(beside.d.trials[0].head_start) << beside.out;
    EXPECT_FALSE(trials_in_turn.d.trials[0].head_start);
    EXPECT_NE(beside.out.find("trial 1: round the update stochastically (trained before the verdict"), std::string::npos)
        << beside.out;
    expect_same_trials(beside.d, trials_in_turn.d);
    ASSERT_TRUE(beside.d.proven_fix);
    EXPECT_TRUE(nlohmann::json::parse(beside.d.to_json()).at("trials").at(0).at("head_start").get<bool>());
  }
}

// By default there is no head start: the trials train after the pair, on every thread,
// and two doctors of the same run on the same thread count give bitwise the same
// numbers, on both bf16 paths (with the head start the switch from half the threads to
// all fell wherever the run ended, and the CPU's bf16 kernels round by thread count).
TEST_F(CompareSideBySideTest, ByDefaultTwoDoctorsOfOneRunGiveBitwiseTheSameTrials) {
  const bool by_default = diagnose::CompareOptions().head_start();
  EXPECT_FALSE(by_default);
  EXPECT_FALSE(run::RunArgs().head_start);
  for (const char* real_bf16 : {"0", "1"}) {
    SCOPED_TRACE(std::string("MIXTRAIN_CPU_BF16=") + real_bf16);
    ::setenv("MIXTRAIN_CPU_BF16", real_bf16, 1);
    const auto nothing = [](Learner&, int) {};
    const Doctored first = doctor_on(2, nothing, /*side_by_side=*/true, by_default);
    const Doctored second = doctor_on(2, nothing, /*side_by_side=*/true, by_default);
    ::unsetenv("MIXTRAIN_CPU_BF16");
    ASSERT_EQ(first.d.verdict, diagnose::Verdict::kLostUpdates) << first.d.report();
    ASSERT_FALSE(first.d.trials.empty()) << first.d.report();
    EXPECT_FALSE(first.d.trials[0].head_start);
    expect_same_pair_evidence(first.d, second.d);
    expect_same_trials(first.d, second.d);
    // Where the time went, phase by phase (doctor_bench prints it; diagnosis.json keeps it).
    ASSERT_EQ(first.d.timing.size(), 4u);
    const std::vector<std::string> phases{"setup", "pair", "after", "trials"};
    for (size_t i = 0; i < phases.size(); ++i) {
      EXPECT_EQ(first.d.timing[i].first, phases[i]);
      EXPECT_GE(first.d.timing[i].second, 0);
    }
    EXPECT_TRUE(nlohmann::json::parse(first.d.to_json()).at("timing").contains("trials"));
  }
}

// The run under diagnosis catches up after the head start began (a learning rate 100x
// higher in its last epoch): the verdict is not lost_updates, so the head start stops and
// leaves no trial; the diagnosis is what the two runs in turn give.
TEST_F(CompareSideBySideTest, AHeadStartTheVerdictDoesNotTryIsDropped) {
  struct CatchUpInTheLastEpoch : Callback {
    void before_batch(Learner& learn) override {
      if (!learn.training() || learn.epoch() < 2) return;
      for (auto& group : learn.opt().param_groups()) group.options().set_lr(2e-2);
    }
  };
  // The head start waits at its 10th batch for the run's end, and must stop right after.
  auto ended = std::make_shared<std::atomic<bool>>(false);
  const auto head = std::make_shared<HoldUntil>(ended, 10);
  const auto catch_up = [ended, head](Learner& learn, int index) {
    if (index == 1) {
      learn.add_cb(std::make_shared<CatchUpInTheLastEpoch>());
      learn.add_cb(std::make_shared<RaiseAtFitEnd>(ended));
    }
    if (index == 2) learn.add_cb(head);
  };
  const Doctored in_turn = doctor_on(1, catch_up);
  *ended = false;
  *head->batches = 0;
  const Doctored beside = doctor_on(2, catch_up);
  ASSERT_NE(in_turn.d.verdict, diagnose::Verdict::kLostUpdates) << in_turn.d.report();
  // It started (the run lost a quarter of its updates), and stopped at the run's end.
  EXPECT_EQ(head->batches->load(), 10) << "the head start did not start, or trained on after the verdict";
  expect_same_pair_evidence(beside.d, in_turn.d);
  expect_same_trials(beside.d, in_turn.d);
  for (const auto& t : beside.d.trials) EXPECT_FALSE(t.head_start);
}

// A head start that fails is the verdict's first trial, failed with its error, as it
// fails in turn; the doctor goes on to the next fix.
TEST_F(CompareSideBySideTest, AHeadStartThatFailsIsAFailedFirstTrial) {
  struct FailAfter : Callback {
    int64_t seen = 0;
    void after_batch(Learner& learn) override {
      if (learn.training() && ++seen == 3) throw std::runtime_error("the trial failed at its third batch");
    }
  };
  const auto fail_first_trial = [](Learner& learn, int index) {
    if (index == 2) learn.add_cb(std::make_shared<FailAfter>());
  };
  const Doctored in_turn = doctor_on(1, fail_first_trial), beside = doctor_on(2, fail_first_trial);
  ASSERT_EQ(beside.d.trials.size(), 2u) << beside.d.report();
  EXPECT_EQ(beside.d.trials[0].error, "the trial failed at its third batch");
  EXPECT_FALSE(beside.d.trials[0].head_start);
  expect_same_trials(beside.d, in_turn.d, /*bitwise=*/1);
}

} // namespace
