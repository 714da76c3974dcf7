// One-cycle lr and momentum against fastai's formula, and the scheduler acting
// on a real optimizer during fit.
#include "test_util.h"

#include <mixtrain/core/learner.h>
#include <mixtrain/core/schedule.h>

#include <cmath>

namespace {

using namespace mixtrain;

/// fastai's SchedCos, written out independently of the library.
double fastai_cos(double start, double end, double pos) {
  return start + (1 + std::cos(M_PI * (1 - pos))) * (end - start) / 2;
}
/// fastai's combined_cos(pct, start, middle, end) at `pos`.
double fastai_combined(double pct, double a, double b, double c, double pos) {
  return pos < pct ? fastai_cos(a, b, pos / pct) : fastai_cos(b, c, (pos - pct) / (1 - pct));
}

TEST(ScheduleTest, OneCycleLrMatchesFastaiFormula) {
  const double lr_max = 3e-3;
  Schedule lr = one_cycle_lr(lr_max);
  EXPECT_DOUBLE_EQ(lr(0.0), lr_max / 25);
  EXPECT_DOUBLE_EQ(lr(0.25), lr_max);
  EXPECT_NEAR(lr(1.0), lr_max / 1e5, 1e-15);
  // Halfway through warm-up the cosine is exactly at the midpoint.
  EXPECT_NEAR(lr(0.125), (lr_max / 25 + lr_max) / 2, 1e-15);
  for (double pos : {0.01, 0.1, 0.2, 0.3, 0.5, 0.75, 0.9, 0.999})
    EXPECT_NEAR(lr(pos), fastai_combined(0.25, lr_max / 25, lr_max, lr_max / 1e5, pos), 1e-15) << pos;
}

TEST(ScheduleTest, OneCycleMomentumMatchesFastaiFormula) {
  Schedule mom = one_cycle_mom();
  EXPECT_DOUBLE_EQ(mom(0.0), 0.95);
  EXPECT_DOUBLE_EQ(mom(0.25), 0.85);
  EXPECT_NEAR(mom(0.625), 0.90, 1e-12);
  EXPECT_NEAR(mom(1.0), 0.95, 1e-12);
  for (double pos : {0.05, 0.2, 0.4, 0.8, 0.99})
    EXPECT_NEAR(mom(pos), fastai_combined(0.25, 0.95, 0.85, 0.95, pos), 1e-15) << pos;
}

TEST(ScheduleTest, CustomOptionsAndValidation) {
  Schedule lr = one_cycle_lr(1.0, OneCycleOptions().pct_start(0.5).div(10).div_final(100));
  EXPECT_DOUBLE_EQ(lr(0.0), 0.1);
  EXPECT_DOUBLE_EQ(lr(0.5), 1.0);
  EXPECT_NEAR(lr(1.0), 0.01, 1e-15);
  EXPECT_THROW_WITH(one_cycle_lr(-1.0), "Invalid lr_max");
  EXPECT_THROW_WITH(combine_scheds({0.5, 0.6}, {sched_const(1), sched_const(2)}), "sum to 1");
  EXPECT_THROW_WITH(ParamScheduler({{"beta9", sched_const(1)}}), "unknown hyper-parameter");
  EXPECT_DOUBLE_EQ(sched_lin(1, 3)(0.5), 2.0);
}

class ScheduleFitTest : public test::SeededTest {};

TEST_F(ScheduleFitTest, FitOneCycleSetsLrAndBeta1EveryStep) {
  // 64 samples, batch 8, drop_last: 8 steps per epoch, 2 epochs = 16 steps.
  auto ds = test::blobs(64);
  data::DataLoaders dls(data::DataLoader(ds, data::DataLoaderOptions().batch_size(8).shuffle(true).drop_last(true)),
                        data::DataLoader(ds, data::DataLoaderOptions().batch_size(8)));
  Learner learn(torch::nn::Linear(4, 3), dls, cross_entropy(), LearnerOptions().progress(false));
  struct Beta1Log : Callback {
    std::vector<double> beta1;
    void after_batch(Learner& l) override {
      if (!l.training()) return;
      auto& o = static_cast<torch::optim::AdamWOptions&>(l.opt().param_groups()[0].options());
      beta1.push_back(std::get<0>(o.betas()));
    }
  };
  auto log = std::make_shared<Beta1Log>();
  learn.add_cb(log);
  const double lr_max = 1e-2;
  learn.fit_one_cycle(2, lr_max);
  const auto& steps = learn.recorder().steps();
  ASSERT_EQ(steps.size(), 16u);
  ASSERT_EQ(log->beta1.size(), 16u);
  for (size_t i = 0; i < steps.size(); ++i) {
    const double pos = static_cast<double>(i) / 16;
    EXPECT_NEAR(steps[i].lr, fastai_combined(0.25, lr_max / 25, lr_max, lr_max / 1e5, pos), 1e-15) << i;
    EXPECT_NEAR(log->beta1[i], fastai_combined(0.25, 0.95, 0.85, 0.95, pos), 1e-15) << i;
  }
  EXPECT_DOUBLE_EQ(steps[4].lr, lr_max);  // pos 0.25 is the peak
}

TEST_F(ScheduleFitTest, SetMomOnSgdAndPlainFitKeepsLrConstant) {
  auto ds = test::blobs(32);
  data::DataLoaders dls(data::DataLoader(ds, data::DataLoaderOptions().batch_size(8)),
                        data::DataLoader(ds, data::DataLoaderOptions().batch_size(8)));
  Learner learn(torch::nn::Linear(4, 3), dls, cross_entropy(), LearnerOptions().progress(false).opt_func(sgd(0.9)));
  learn.fit(1, 0.05);
  for (const auto& s : learn.recorder().steps()) EXPECT_DOUBLE_EQ(s.lr, 0.05);
  EXPECT_TRUE(set_mom(learn.opt(), 0.5));
  auto& o = static_cast<torch::optim::SGDOptions&>(learn.opt().param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.momentum(), 0.5);
}

} // namespace
