// The doctor's fp32 baseline trained beside the run under diagnosis on a second thread,
// each on half the intra-op threads (CompareOptions::side_by_side): each arm must compute
// exactly what it computes alone on that many threads, or the pair trains in turn.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

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
  for (const int failing : {0, 1}) {  // 0: the baseline, on the second thread; 1: the run
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

} // namespace
