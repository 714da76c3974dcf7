// Learner::lr_find: fastai's schedule, stop rule and suggestions, and a restore
// after which the next fit runs bitwise as if lr_find never ran.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <cmath>

namespace {

using namespace mixtrain;

class LrFindTest : public test::SeededTest {
 protected:
  static std::unique_ptr<Learner> make(int64_t n_train = 512) {
    torch::manual_seed(0);
    auto net = torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
    return std::make_unique<Learner>(
        net, data::DataLoaders::from_split({test::blobs(n_train, 3, 4, 31), test::blobs(128, 3, 4, 32)}, 32, 1),
        cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
  }
};

TEST_F(LrFindTest, TheScheduleIsFastaisExponentialSweep) {
  auto learn = make();
  const auto r = learn->lr_find(LrFindOptions().start_lr(1e-6).end_lr(1e-2).num_it(12).stop_div(false));
  ASSERT_EQ(r.lrs.size(), 12u);  // stops after num_it steps
  for (size_t i = 0; i < r.lrs.size(); ++i)  // fastai's SchedExp at pos = train_iter / num_it
    EXPECT_DOUBLE_EQ(r.lrs[i], 1e-6 * std::pow(1e-2 / 1e-6, static_cast<double>(i) / 12));
  EXPECT_FALSE(r.diverged);
  EXPECT_EQ(r.epochs, 1);
}

TEST_F(LrFindTest, ItStopsWhenTheSmoothedLossExceedsFourTimesItsMinimumAndCyclesAShortLoader) {
  auto learn = make(/*n_train=*/128);  // 4 batches per epoch: 100 steps need the loader cycled
  const auto r = learn->lr_find(LrFindOptions().end_lr(1e4));
  ASSERT_FALSE(r.smooth_losses.empty());
  EXPECT_TRUE(r.diverged);
  EXPECT_LT(r.lrs.size(), 100u);
  const double best = *std::min_element(r.smooth_losses.begin(), r.smooth_losses.end() - 1);
  const double last = r.smooth_losses.back(), loss = r.losses.back();
  EXPECT_TRUE(last > 4 * best || !std::isfinite(loss)) << last << " vs best " << best;
  for (size_t i = 0; i + 1 < r.smooth_losses.size(); ++i)  // it did not stop earlier than it had to
    EXPECT_LE(r.smooth_losses[i], 4 * *std::min_element(r.smooth_losses.begin(), r.smooth_losses.begin() + i + 1));
  EXPECT_GT(r.epochs, 1);  // the loader was cycled
  EXPECT_GT(r.valley, 0);
  EXPECT_LT(r.valley, r.lrs.back());
}

TEST(LrFindSuggestionTest, ValleySteepAndMinimumOnARecordedCurve) {
  // A curve that falls slowly, then fast, bottoms out and rises.
  const std::vector<double> lrs = {1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0};
  const std::vector<double> losses = {2.0, 1.9, 1.0, 0.8, 0.5, 0.9, 3.0};
  // minimum: lr at the lowest loss (0.1) / 10.
  EXPECT_DOUBLE_EQ(suggest_minimum(lrs, losses), 1e-2);
  // steep: the steepest descent per log-lr is 1.9 -> 1.0, starting at 1e-4.
  EXPECT_DOUBLE_EQ(suggest_steep(lrs, losses), 1e-4);
  // valley: fastai's loop, run here by hand. The longest decreasing run ends at index 4 (0.5)
  // with length 5, so max_start = 4 - 5 = -1 and idx = -1 + 1 + 0 = 0 (clamped at 0).
  std::vector<int64_t> lds(losses.size(), 1);
  int64_t max_start = 0, max_end = 0;
  for (size_t i = 1; i < losses.size(); ++i)
    for (size_t j = 0; j < i; ++j) {
      if (losses[i] < losses[j] && lds[i] < lds[j] + 1) lds[i] = lds[j] + 1;
      if (lds[max_end] < lds[i]) max_end = static_cast<int64_t>(i), max_start = max_end - lds[max_end];
    }
  const double sections = static_cast<double>(max_end - max_start) / 3;
  const int64_t idx = max_start + static_cast<int64_t>(sections) + static_cast<int64_t>(sections / 2);
  EXPECT_EQ(max_end, 4);
  EXPECT_EQ(idx, 0);
  EXPECT_DOUBLE_EQ(suggest_valley(lrs, losses), lrs[0]);
  // The run 3.0 2.0 1.5 1.2 1.1 1.0 (indices 0, 2..6; 3.5 is skipped): max_start 0, max_end 6,
  // sections 2, idx = 0 + 2 + 1 = 3.
  const std::vector<double> lrs2 = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0};
  const std::vector<double> losses2 = {3.0, 3.5, 2.0, 1.5, 1.2, 1.1, 1.0, 2.0};
  EXPECT_DOUBLE_EQ(suggest_valley(lrs2, losses2), 1e-3);
  EXPECT_TRUE(std::isnan(suggest_valley({1e-3}, {1.0})));
}

TEST_F(LrFindTest, TheNextFitRunsBitwiseAsIfLrFindNeverRan) {
  auto a = make(), b = make();
  a->fit_one_cycle(1, 1e-2);  // a Learner with history, an optimizer state and moved generators
  b->fit_one_cycle(1, 1e-2);
  const auto r = a->lr_find(LrFindOptions().num_it(30));
  EXPECT_FALSE(r.lrs.empty());
  EXPECT_EQ(a->recorder().steps().size(), b->recorder().steps().size());  // the sweep left no rows
  a->fit_one_cycle(2, 5e-3);
  b->fit_one_cycle(2, 5e-3);
  test::expect_bitwise_equal(a->model().state_tensors(), b->model().state_tensors());
  ASSERT_EQ(a->recorder().steps().size(), b->recorder().steps().size());
  for (size_t i = 0; i < a->recorder().steps().size(); ++i)
    EXPECT_EQ(a->recorder().steps()[i].loss, b->recorder().steps()[i].loss);
}

TEST_F(LrFindTest, UnderFp16ASkippedStepIsVisibleAndTheCurveStaysFinite) {
  auto learn = make();
  learn->to_fp16(amp::GradScalerOptions().init_scale(std::pow(2.0, 40)));  // the first steps overflow and skip
  const auto r = learn->lr_find(LrFindOptions().num_it(40).stop_div(false).end_lr(1e-1));
  ASSERT_EQ(r.lrs.size(), 40u);
  EXPECT_TRUE(r.skipped.front());
  for (double s : r.smooth_losses) EXPECT_TRUE(std::isfinite(s));
  EXPECT_TRUE(std::isfinite(r.valley));
  EXPECT_EQ(learn->precision_cb()->loss_scale(), std::pow(2.0, 40));  // the scaler was restored too
}

TEST_F(LrFindTest, BadOptionsAreErrorsNamingThem) {
  auto learn = make();
  EXPECT_THROW_WITH(learn->lr_find(LrFindOptions().start_lr(0)), "Invalid start_lr: 0 (must be > 0)");
  EXPECT_THROW_WITH(learn->lr_find(LrFindOptions().start_lr(1).end_lr(0.1)), "Invalid end_lr: 0.1 (must be above the start lr 1)");
  EXPECT_THROW_WITH(learn->lr_find(LrFindOptions().num_it(1)), "Invalid num_it: 1 (must be >= 7)");
  EXPECT_THROW_WITH(learn->lr_find(LrFindOptions().num_it(6)), "Invalid num_it: 6 (must be >= 7)");
  const auto seven = learn->lr_find(LrFindOptions().num_it(7).stop_div(false));
  EXPECT_TRUE(std::isfinite(seven.valley) && std::isfinite(seven.steep) && std::isfinite(seven.minimum)) << seven.summary();
}

TEST_F(LrFindTest, TheChartAndTableHoldTheCurve) {
  auto learn = make();
  const auto r = learn->lr_find(LrFindOptions().num_it(30));
  const std::string svg = r.svg(), csv = r.csv();
  EXPECT_NE(svg.find("learning rate (log scale)"), std::string::npos);
  EXPECT_NE(svg.find("valley"), std::string::npos);
  EXPECT_NE(svg.find("1e-7"), std::string::npos);  // decade ticks
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), static_cast<long>(r.lrs.size()) + 1);
  EXPECT_NE(r.summary().find("valley "), std::string::npos);
}

} // namespace
