// MixedPrecision with the Learner: skips are visible in the Recorder and the
// epoch table, the history survives fit and to_fp32, bf16 trains on CPU.
#include "test_util.h"

#include <mixtrain/amp/mixed_precision.h>
#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;

data::DataLoaders mixed_precision_loaders() {
  return data::DataLoaders::from_split({test::blobs(256, 3, 4, 21), test::blobs(128, 3, 4, 22)}, 32, 1);
}

/// Checks, at every step, that the weights did not move when the step was skipped.
class WatchWeights : public Callback {
 public:
  WatchWeights() { order = 90; }
  void before_batch(Learner& learn) override {
    if (learn.training()) before_ = learn.model().module().parameters()[0].detach().clone();
  }
  void after_batch(Learner& learn) override {
    if (!learn.training()) return;
    const bool moved = !torch::equal(before_, learn.model().module().parameters()[0]);
    moved_.push_back(moved);
  }
  std::vector<bool> moved_;
 private:
  torch::Tensor before_;
};

class MixedPrecisionTest : public test::SeededTest {};

TEST_F(MixedPrecisionTest, InjectedOverflowsAreSkippedRecordedAndKept) {
  Learner learn(torch::nn::Linear(4, 3), mixed_precision_loaders(), cross_entropy(), LearnerOptions().progress(false));
  // fp32 compute with a real GradScaler (growth_interval 2): the skip logic without fp16.
  learn.add_cb(std::make_shared<amp::MixedPrecision>(torch::kFloat, amp::GradScalerOptions().growth_interval(2)));
  auto watch = std::make_shared<WatchWeights>();
  learn.add_cb(std::make_shared<test::InjectOverflow>(std::set<int64_t>{0, 1, 5})).add_cb(watch);
  std::ostringstream table;
  learn.add_cb(std::make_shared<callbacks::ProgressCallback>(table, false));
  learn.fit(1, 1e-2);

  const auto& steps = learn.recorder().steps();
  ASSERT_EQ(steps.size(), 8u);
  const std::vector<double> expected_scale = {65536, 32768, 16384, 16384, 32768, 32768, 16384, 16384};
  for (size_t i = 0; i < steps.size(); ++i) {
    const bool skip = i == 0 || i == 1 || i == 5;
    EXPECT_EQ(steps[i].skipped, skip) << i;
    EXPECT_EQ(steps[i].scale, expected_scale[i]) << i;
    EXPECT_EQ(watch->moved_[i], !skip) << i;
  }
  EXPECT_EQ(learn.recorder().values().back().skipped, 3);
  EXPECT_NE(table.str().find("skipped 3/8"), std::string::npos) << table.str();
  ASSERT_NE(learn.precision_cb(), nullptr);
  EXPECT_EQ(learn.recorder().skipped_steps(), 3);  // the Recorder keeps the history after fit
  EXPECT_TRUE(learn.precision_cb()->loss_scaled());
  // The logged loss is the unscaled one.
  EXPECT_LT(steps[0].loss, 10.0);
  learn.to_fp32();
  EXPECT_EQ(learn.precision_cb(), nullptr);
  EXPECT_EQ(learn.precision(), Precision::kFp32);
  EXPECT_EQ(learn.recorder().steps().size(), 8u);  // history survives to_fp32
  EXPECT_TRUE(learn.recorder().steps()[0].skipped);
}

TEST_F(MixedPrecisionTest, Bf16OnCpuTrainsWithFp32PredsAndNoScaler) {
  Learner learn(torch::nn::Linear(4, 3), mixed_precision_loaders(), cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
  struct PredDtype : Callback {
    std::set<c10::ScalarType> seen;
    PredDtype() { order = 20; }
    void after_pred(Learner& l) override { seen.insert(l.pred().scalar_type()); }
  };
  auto dtypes = std::make_shared<PredDtype>();
  learn.to_bf16().add_cb(dtypes);
  learn.fit_one_cycle(3, 2e-2);
  EXPECT_EQ(dtypes->seen, (std::set<c10::ScalarType>{torch::kFloat}));
  EXPECT_GT(learn.recorder().values().back().metrics[0], 0.9);
  EXPECT_FALSE(learn.precision_cb()->loss_scaled());
  EXPECT_EQ(learn.precision_cb()->grad_scaler(), nullptr);
  EXPECT_TRUE(std::isnan(learn.recorder().steps().back().scale));
  EXPECT_FALSE(mixtrain::compat::is_autocast_enabled(torch::kCPU));  // the guard closed
}

TEST_F(MixedPrecisionTest, ToFp16ReplacesAndChains) {
  Learner learn(torch::nn::Linear(4, 3), mixed_precision_loaders(), cross_entropy(), LearnerOptions().progress(false));
  learn.to_bf16().to_fp16(amp::GradScalerOptions().init_scale(256));
  int count = 0;
  for (const auto& cb : learn.cbs()) count += std::dynamic_pointer_cast<PrecisionCallback>(cb) != nullptr;
  EXPECT_EQ(count, 1);
  EXPECT_EQ(learn.precision_cb()->dtype(), torch::kHalf);
  EXPECT_EQ(learn.precision_cb()->loss_scale(), 256);
  EXPECT_FALSE(learn.precision_cb()->emulated());  // decided at fit start, by the Learner's device
  learn.fit(1);
  EXPECT_TRUE(learn.precision_cb()->emulated());   // this Learner trains on the CPU: fp16 is emulated
}

TEST_F(MixedPrecisionTest, AccumulationStepsTheScalerOnlyOnTheBoundaryAndClipRecordsNorms) {
  Learner learn(torch::nn::Linear(4, 3), mixed_precision_loaders(), cross_entropy(), LearnerOptions().progress(false));
  learn.add_cb(std::make_shared<amp::MixedPrecision>(torch::kFloat, amp::GradScalerOptions().growth_interval(1)));
  learn.add_cb(std::make_shared<callbacks::GradientAccumulation>(2));
  learn.add_cb(std::make_shared<callbacks::GradientClip>(0.5));
  learn.fit(1, 1e-2);
  int64_t attempted = 0;  // steps that recorded a scale: 8 batches, one step per 2
  for (double s : test::recorded_scales(learn)) attempted += std::isfinite(s);
  EXPECT_EQ(attempted, 4);
  EXPECT_EQ(learn.precision_cb()->loss_scale(), 65536.0 * 16);  // 4 clean updates, growth_interval 1
  const auto& steps = learn.recorder().steps();
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(std::isfinite(steps[i].grad_norm), i % 2 == 1) << i;  // clipped only where it stepped
    if (i % 2 == 1) EXPECT_LT(steps[i].grad_norm, 100.0) << "clip saw scaled gradients";
  }
}

} // namespace

namespace {

// validate() and get_preds() right after to_fp16() (no fit yet, e.g. after load)
// run the emulated fp16 forward pass on a CPU instead of throwing libtorch's
// "AutocastCPU only supports Bfloat16".
TEST(MixedPrecisionEvalTest, ValidateAndGetPredsBeforeAnyFitUseTheEmulation) {
  torch::manual_seed(5);
  Learner learn(torch::nn::Linear(4, 3), mixed_precision_loaders(), cross_entropy(), LearnerOptions().progress(false));
  const double fp32_loss = learn.validate().at(0);
  learn.to_fp16();
  std::vector<double> fp16;
  ASSERT_NO_THROW(fp16 = learn.validate());
  EXPECT_TRUE(learn.precision_cb()->emulated());
  EXPECT_NE(fp16.at(0), fp32_loss);  // the logits were rounded to half
  EXPECT_NEAR(fp16.at(0), fp32_loss, 1e-2);
  auto preds = learn.get_preds();
  EXPECT_EQ(preds.first.size(0), preds.second.size(0));
  EXPECT_FALSE(mixtrain::amp::ReducedPrecisionEmulation::is_enabled());  // closed after the pass
}

} // namespace

namespace {

// A model that throws (not a cancel) ends fit without after_ events; the guards the
// callback held open must not stay on for the caller's thread.
TEST(MixedPrecisionEvalTest, AnExceptionFromTheModelLeavesNoAutocastOrEmulationOn) {
  struct ThrowsImpl : torch::nn::Module {
    ThrowsImpl() : fc(register_module("fc", torch::nn::Linear(4, 3))) {}
    torch::Tensor forward(torch::Tensor x) {
      if (++calls == 2) throw std::runtime_error("model failed");
      return fc(x);
    }
    torch::nn::Linear fc;
    int calls = 0;
  };
  TORCH_MODULE(Throws);
  for (bool fp16 : {true, false}) {
    SCOPED_TRACE(fp16 ? "fp16" : "bf16");
    Learner learn(Throws(), mixed_precision_loaders(), cross_entropy(), LearnerOptions().progress(false));
    if (fp16)
      learn.to_fp16();
    else
      learn.to_bf16();
    EXPECT_THROW(learn.fit(1, 1e-2), std::runtime_error);
    EXPECT_FALSE(mixtrain::amp::ReducedPrecisionEmulation::is_enabled());
    EXPECT_FALSE(mixtrain::compat::is_autocast_enabled(torch::kCPU));
  }
}

} // namespace
