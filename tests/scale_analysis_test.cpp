// Scale-history analysis (skip rate per epoch, collapse, pinned minimum with a
// flat loss) and the end-of-fit warning fastai never gives.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;
class ScaleAnalysisTest : public test::SeededTest {};

std::vector<StepRecord> history(const std::vector<double>& scales, const std::vector<bool>& skipped,
                                int64_t steps_per_epoch, double loss = 1.0) {
  std::vector<StepRecord> steps;
  for (size_t i = 0; i < scales.size(); ++i) {
    StepRecord s;
    s.iter = static_cast<int64_t>(i);
    s.epoch = static_cast<int64_t>(i) / steps_per_epoch;
    s.loss = s.smooth_loss = loss;
    s.scale = scales[i];
    s.skipped = skipped[i];
    steps.push_back(s);
  }
  return steps;
}

TEST_F(ScaleAnalysisTest, SkipRatePerEpochAndBackoffs) {
  // Epoch 0: skip at steps 0 and 2 (scale halves after each); epoch 1: clean.
  const auto a = diagnose::analyze_scale_history(
      history({65536, 32768, 32768, 16384, 16384, 16384, 16384, 16384}, {true, false, true, false, false, false, false, false}, 4));
  EXPECT_EQ(a.steps, 8);
  EXPECT_EQ(a.skipped, 2);
  EXPECT_DOUBLE_EQ(a.skip_rate, 0.25);
  ASSERT_EQ(a.skip_rate_per_epoch.size(), 2u);
  EXPECT_DOUBLE_EQ(a.skip_rate_per_epoch[0], 0.5);
  EXPECT_DOUBLE_EQ(a.skip_rate_per_epoch[1], 0.0);
  EXPECT_EQ(a.backoffs, 2);
  EXPECT_EQ(a.initial_scale, 65536);
  EXPECT_EQ(a.final_scale, 16384);
  EXPECT_EQ(a.longest_skip_run, 1);
  EXPECT_EQ(a.settling_steps, 1);
  EXPECT_DOUBLE_EQ(a.skip_rate_after_settling, 1.0 / 7);
  EXPECT_FALSE(a.collapsed);
  EXPECT_TRUE(a.has_scale);
}

TEST_F(ScaleAnalysisTest, RepeatedBackoffToTinyScalesIsACollapse) {
  std::vector<double> scales;
  std::vector<bool> skipped;
  for (int i = 0; i < 20; ++i) {
    scales.push_back(std::ldexp(1.0, 16 - i));
    skipped.push_back(true);
  }
  const auto a = diagnose::analyze_scale_history(history(scales, skipped, 10));
  EXPECT_TRUE(a.collapsed);
  EXPECT_EQ(a.longest_skip_run, 20);
  EXPECT_LE(a.min_scale, 1.0);
  // Facts, and the doctor for the verdict: a collapse alone does not tell an overflowing
  // forward pass from overflowing gradients (the doctor's trace does).
  const std::string w = diagnose::fit_warning(a).str(run::flag_words());
  EXPECT_NE(w.find("20 of 20 steps (100%) were skipped for inf/NaN gradients and the loss scale collapsed"), std::string::npos) << w;
  EXPECT_NE(w.find("`mixtrain doctor` tells which problem this is"), std::string::npos) << w;
  EXPECT_EQ(w.find("likely"), std::string::npos) << w;
}

// NaN losses (a forward overflow: a loss is computed before any scaling): the warning
// says where the first was, and gives no advice about the scaler.
TEST_F(ScaleAnalysisTest, NanLossesWarnOfTheForwardPassNotTheScaler) {
  diagnose::ScaleAnalysis a;
  a.has_scale = true;
  a.steps = a.skipped = a.settling_steps = a.nonfinite_losses = 10;
  a.skip_rate = 1.0;
  a.first_nonfinite_step = a.first_nonfinite_epoch = 0;
  a.initial_scale = 65536;
  const std::string w = diagnose::fit_warning(a).str(run::keyword_words());
  EXPECT_NE(w.find("10 losses were NaN/inf, the first at step 0 (a loss is computed before any scaling: the forward pass "
                   "overflowed there)"), std::string::npos) << w;
  EXPECT_NE(w.find("`mixtrain.doctor()` tells"), std::string::npos) << w;
  EXPECT_EQ(w.find("init_scale"), std::string::npos) << w;
  EXPECT_EQ(w.find("underflow"), std::string::npos) << w;
}

TEST_F(ScaleAnalysisTest, BackingOffFromATooHighInitialScaleIsSettlingNotCollapse) {
  // 2^40 down to 2^30 in ten skipped steps, then clean: the scaler found its level.
  std::vector<double> scales;
  std::vector<bool> skipped;
  for (int i = 0; i < 40; ++i) {
    scales.push_back(std::ldexp(1.0, std::max(30, 40 - i)));
    skipped.push_back(i < 10);
  }
  const auto a = diagnose::analyze_scale_history(history(scales, skipped, 20));
  EXPECT_FALSE(a.collapsed);
  EXPECT_EQ(a.settling_steps, 10);
  EXPECT_DOUBLE_EQ(a.skip_rate_after_settling, 0.0);
  const std::string w = diagnose::fit_warning(a).str(run::flag_words());
  EXPECT_EQ(w.find("likely"), std::string::npos) << w;
  EXPECT_NE(w.find("10 of them were the first steps, backing off from the initial scale 1.1e+12 (start lower: --init-scale)"),
            std::string::npos) << w;
}

TEST_F(ScaleAnalysisTest, PinnedAtMinimumWithFlatLoss) {
  std::vector<double> scales(40, 1024.0);
  scales[0] = 65536;
  const auto flat = diagnose::analyze_scale_history(history(scales, std::vector<bool>(40, false), 20, 0.9));
  EXPECT_TRUE(flat.pinned_at_min_with_flat_loss);
  // The same scales with a falling loss are not pinned-and-flat.
  auto learning = history(scales, std::vector<bool>(40, false), 20);
  for (size_t i = 0; i < learning.size(); ++i) learning[i].smooth_loss = 2.0 - 0.04 * i;
  EXPECT_FALSE(diagnose::analyze_scale_history(learning).pinned_at_min_with_flat_loss);
}

TEST_F(ScaleAnalysisTest, NonFiniteLossesAndNoScaler) {
  auto steps = history(std::vector<double>(6, NAN), std::vector<bool>(6, false), 3);
  steps[4].loss = NAN;
  const auto a = diagnose::analyze_scale_history(steps);
  EXPECT_FALSE(a.has_scale);
  EXPECT_EQ(a.nonfinite_losses, 1);
  EXPECT_EQ(a.first_nonfinite_step, 4);
  EXPECT_EQ(a.first_nonfinite_epoch, 1);
  EXPECT_TRUE(diagnose::fit_warning(a).empty());  // no scaler, no skip warning
}

TEST_F(ScaleAnalysisTest, FitWarnsAboveFivePercentSkippedAndStaysSilentBelow) {
  auto ds = test::blobs(160, 3, 4);
  auto make = [&] {
    auto dls = data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)),
                                 data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)));
    auto learn = std::make_unique<Learner>(Model(torch::nn::Linear(4, 3)), std::move(dls), cross_entropy(),
                                           LearnerOptions().progress(false));
    learn->add_cb(std::make_shared<diagnose::FitWarning>());  // the run layer attaches it for fp16
    return learn;
  };
  // 10 steps with 4 overflows = 40% > 5%, and more than a scaler's calibration: a warning naming the verdict.
  auto learn = make();
  learn->to_fp16(amp::GradScalerOptions().init_scale(256));  // low enough that nothing overflows by itself
  learn->fit(1, 1e-2, {std::make_shared<test::InjectOverflow>(std::set<int64_t>{3, 4, 6, 8})});
  const std::string w = learn->get_cb<diagnose::FitWarning>()->message().str();
  EXPECT_NE(w.find("4 of 10 steps (40%) were skipped"), std::string::npos) << w;
  EXPECT_NE(w.find("diagnose::compare() tells which problem this is"), std::string::npos) << w;
  // The next fit without overflow is judged on its own steps: silent.
  learn->fit(2, 1e-2);
  EXPECT_EQ(learn->get_cb<diagnose::FitWarning>()->message().str(), "");
  // 1 of 10 is above 5% but only a scaler finding its level (kCalibrationSkips): silent.
  auto calibrating = make();
  calibrating->to_fp16(amp::GradScalerOptions().init_scale(256));
  calibrating->fit(1, 1e-2, {std::make_shared<test::InjectOverflow>(std::set<int64_t>{3})});
  EXPECT_EQ(calibrating->get_cb<diagnose::FitWarning>()->message().str(), "");
  // 1 of 20 = 5% is not above the threshold.
  auto quiet = make();
  quiet->to_fp16(amp::GradScalerOptions().init_scale(256));
  quiet->fit(2, 1e-2, {std::make_shared<test::InjectOverflow>(std::set<int64_t>{3})});
  EXPECT_EQ(quiet->recorder().skipped_steps(), 1);
  EXPECT_EQ(quiet->get_cb<diagnose::FitWarning>()->message().str(), "");
}

// A few skips are the scaler finding its level (in a short run they pass 5% alone);
// more than kCalibrationSkips at more than 5% are too many, wherever they happen.
TEST_F(ScaleAnalysisTest, AShortCalibrationAtTheStartIsNotTooManySkips) {
  auto run = [](const std::vector<int>& skipped_at) {
    std::vector<double> scales;
    std::vector<bool> skipped(32, false);
    double scale = 65536;
    for (int i = 0; i < 32; ++i) {
      scales.push_back(scale);
      if (std::count(skipped_at.begin(), skipped_at.end(), i)) skipped[i] = true, scale /= 2;
    }
    return diagnose::analyze_scale_history(history(scales, skipped, 32));
  };
  const auto calibration = run({0, 1});  // 2 of 32 (6.25%), both while settling
  EXPECT_EQ(calibration.settling_steps, 2);
  EXPECT_FALSE(diagnose::skips_are_a_problem(calibration));
  EXPECT_TRUE(diagnose::fit_warning(calibration).empty());
  EXPECT_FALSE(diagnose::skips_are_a_problem(run({13, 14})));      // the transformer's: at the peak lr
  EXPECT_TRUE(diagnose::skips_are_a_problem(run({0, 1, 2, 3})));   // a longer back-off than calibration
  EXPECT_TRUE(diagnose::skips_are_a_problem(run({3, 9, 15, 21})));
  EXPECT_FALSE(diagnose::fit_warning(run({0, 1, 2, 3})).empty());
}

} // namespace
