// The ops one training step dispatches, held to a recorded figure: the built-in CNN in
// fp32 and fp16, stepped as `mixtrain train` steps it (mixtrain::optim's AdamW). A change
// that adds work to every step (a cast, a copy, a callback's read) shows here as a
// number, on any machine; one that removes some must lower the figure in the same
// commit. BENCHMARKS.md "Where a step goes" sets the counts beside a Python loop's.
#include "test_util.h"

#include <mixtrain/diagnose/step_ops.h>
#include <mixtrain/mixtrain.h>

#include <cstdlib>
#include <stdexcept>

namespace {

using namespace mixtrain;

/// The CNN's figures (diagnose::count_step_ops, torch 2.13, the third training step).
/// fp32's 61: the forward, loss and backward with autograd's own detach of each new
/// gradient (Python's loop dispatches the same work), the core optimizer's one pass (a
/// detach of each weight; libtorch's zero_grad detaches each gradient), and the
/// Learner's own few (the loss's copy for the callbacks, the batch's gather). fp16 adds
/// the loss scale's multiply and the scaler's check of the gradients. The CNN's
/// channels-last activations (models/channels_last.h) add 4 in fp32: the batch's
/// restride, and the flatten's copy to the default layout with its gradient's copy back
/// (a `contiguous` each); fp16's emulated convolutions write the default layout, so there
/// only the restride is added. MIXTRAIN_CONTIGUOUS_CONV=1 gives the default layout's 61 and 65.
const int64_t kCnnFp32Ops = models::channels_last_activations() ? 65 : 61;
const int64_t kCnnFp16Ops = models::channels_last_activations() ? 66 : 65;

class StepOpsTest : public test::SeededTest {
 protected:
  static diagnose::StepOps count(Precision precision) {
    const data::Dataset train{torch::randn({64, 1, 28, 28}), torch::randint(0, 10, {64})};
    const data::Dataset valid{torch::randn({16, 1, 28, 28}), torch::randint(0, 10, {16})};
    Learner learn(models::simple_cnn(), data::DataLoaders::from_split({train, valid}, 16, 0), cross_entropy(),
                  LearnerOptions().progress(false).opt_func(optim::factory(OptimizerSettings(), optim::Rounding())));
    learn.set_precision(precision);
    return diagnose::count_step_ops(learn, 2);
  }
};

TEST_F(StepOpsTest, TheCnnStepDispatchesItsRecordedNumberOfOpsInFp32AndFp16) {
  const diagnose::StepOps fp32 = count(Precision::kFp32);
  EXPECT_EQ(fp32.ops, kCnnFp32Ops) << "the fp32 CNN step now dispatches " << fp32.ops << " ops (recorded "
                                   << kCnnFp32Ops << "); if that is meant, update the figure: " << fp32.str();
  const diagnose::StepOps fp16 = count(Precision::kFp16);
  EXPECT_EQ(fp16.ops, kCnnFp16Ops) << "the fp16 CNN step now dispatches " << fp16.ops << " ops (recorded "
                                   << kCnnFp16Ops << "); if that is meant, update the figure: " << fp16.str();
  // The step's own work is all there: two convolutions forward and back, the optimizer's
  // detaches, and memory for the activations.
  EXPECT_EQ(fp32.by_op.at("aten::conv2d"), 2);
  EXPECT_EQ(fp32.by_op.at("aten::convolution_backward"), 2);
  EXPECT_GT(fp32.allocations, 0);
  EXPECT_GT(fp32.allocated_bytes, 16 * 16 * 14 * 14 * 4);  // the first convolution's output, at least
}

TEST_F(StepOpsTest, AStepKeepsNoActivationCastOrGraphPastItsEnd) {
  // What a step may hold when it ends, until the next step replaces it: its prediction and
  // loss (the callbacks read them), and its batch where the step casts it (bf16-master).
  // One activation of the first convolution is 200 KB; autocast's cast cache of the
  // convolutions' weights is 9.5 KB in bf16 (mutation-checked: a cache cleared when the
  // next step's autocast opens, and a graph retained by the backward, both fail here).
  const int64_t pred = 16 * 10 * 4, loss = 8, batch = 16 * 28 * 28 * 4;
  // Both CPU bf16 paths: the CPU's own bf16 kernels, and the emulation's fp32 tensors.
  struct UnsetAfter {
    ~UnsetAfter() { ::unsetenv("MIXTRAIN_CPU_BF16"); }
  } unset_after;
  for (const char* real_bf16 : {"1", "0"}) {
    ::setenv("MIXTRAIN_CPU_BF16", real_bf16, 1);
    for (const Precision p : {Precision::kFp32, Precision::kFp16, Precision::kBf16, Precision::kBf16Pure,
                              Precision::kBf16Master}) {
      SCOPED_TRACE(precision_name(p) + ", MIXTRAIN_CPU_BF16=" + real_bf16);
      const diagnose::StepOps step = count(p);
      const int64_t allowed = pred + loss + (p == Precision::kBf16Master ? batch : 0);
      EXPECT_GE(step.kept_bytes, pred) << "the prediction is kept for the callbacks";
      EXPECT_LE(step.kept_bytes, allowed) << "the step keeps " << step.kept_bytes << " bytes of its allocations past its end";
    }
  }
}

TEST_F(StepOpsTest, AStepThatIsNotInTheEpochIsOneLine) {
  const data::Dataset train{torch::randn({32, 1, 28, 28}), torch::randint(0, 10, {32})};
  Learner learn(models::simple_cnn(), data::DataLoaders::from_split({train, train}, 16, 0), cross_entropy(),
                LearnerOptions().progress(false));
  try {
    diagnose::count_step_ops(learn, 2);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "count_step_ops: step 2 is not one of the 2 training batches of an epoch");
  }
  EXPECT_THROW(diagnose::count_step_ops(learn, -1), std::invalid_argument);
}

/// Stops the fit at the end of its first batch, as an early stop would.
class StopAfterFirstBatch : public Callback {
 public:
  void after_batch(Learner&) override { throw CancelFitException(); }
};

TEST_F(StepOpsTest, AFitStoppedBeforeTheStepIsAnErrorNotZeroOps) {
  const data::Dataset train{torch::randn({64, 1, 28, 28}), torch::randint(0, 10, {64})};
  Learner learn(models::simple_cnn(), data::DataLoaders::from_split({train, train}, 16, 0), cross_entropy(),
                LearnerOptions().progress(false));
  learn.add_cb(std::make_shared<StopAfterFirstBatch>());
  try {
    diagnose::count_step_ops(learn, 2);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "count_step_ops: the fit stopped before training step 2 ended, so it was not counted");
  }
}

} // namespace
