// LossScaleRule, the one scale-update rule GradScaler and MasterWeights share:
// torch's rule, fastai v1's max_noskip / max_scale, and the extras.
#include "test_util.h"

#include <mixtrain/amp/loss_scale_rule.h>

#include <cmath>

namespace {

using mixtrain::amp::LossScaleRule;
using mixtrain::amp::LossScaleRuleOptions;

std::vector<double> scales_after(LossScaleRule& rule, const std::vector<bool>& overflows) {
  std::vector<double> scales;
  for (bool o : overflows) {
    rule.update(o);
    scales.push_back(rule.scale());
  }
  return scales;
}

LossScaleRuleOptions torch_options(int64_t interval) {
  LossScaleRuleOptions o;
  o.growth_interval = interval;
  return o;
}

TEST(LossScaleRuleTest, TorchRuleBacksOffOnEveryOverflowAndGrowsAfterTheInterval) {
  LossScaleRule rule(65536, torch_options(3));
  // Overflows at steps 0, 1, 2, then clean: grows after every 3 clean steps.
  const auto scales = scales_after(rule, {true, true, true, false, false, false, false, false, false, true, false});
  const std::vector<double> expected{32768, 16384, 8192, 8192, 8192, 16384, 16384, 16384, 32768, 16384, 16384};
  EXPECT_EQ(scales, expected);
  EXPECT_EQ(rule.growth_tracker(), 1);
}

TEST(LossScaleRuleTest, GrowthStopsAtMaxScaleAndBeforeInfinity) {
  LossScaleRuleOptions o = torch_options(1);
  o.max_scale = 100000;
  LossScaleRule capped(65536, o);
  EXPECT_EQ(scales_after(capped, {false, false}), (std::vector<double>{100000, 100000}));
  LossScaleRule huge(std::pow(2.0, 127), torch_options(1));  // float's largest power of two
  EXPECT_EQ(scales_after(huge, {false}), (std::vector<double>{std::pow(2.0, 127)}));  // 2^128 is inf in float: kept
}

TEST(LossScaleRuleTest, FastaiV1HalvesWhileAboveOneAndDoublesAfterMaxNoskip) {
  LossScaleRuleOptions v1;  // what MasterWeights uses
  v1.growth_interval = 2;   // max_noskip
  v1.min_scale = 1;
  v1.throw_at_min_scale = false;
  v1.max_scale = 8;
  LossScaleRule rule(4, v1);
  const auto scales = scales_after(rule, {true, true, true, true, false, false, false, false, false, false, false, false});
  // 4 -> 2 -> 1, then stays at 1 (v1 halves only while above 1, and never throws);
  // two clean steps double it, up to max_scale 8.
  const std::vector<double> expected{2, 1, 1, 1, 1, 2, 2, 4, 4, 8, 8, 8};
  EXPECT_EQ(scales, expected);
}

TEST(LossScaleRuleTest, MinScaleThrowsWhenAskedComparedAsTheFloatItIsStoredIn) {
  LossScaleRuleOptions o = torch_options(2000);
  o.min_scale = 0.1;  // not a float: the stored scale is float(0.1) > 0.1 in double
  LossScaleRule rule(0.4, o);
  rule.update(true);
  rule.update(true);
  EXPECT_EQ(rule.scale(), static_cast<double>(0.1f));
  EXPECT_THROW_WITH(rule.update(true), "gradients still overflow at min_scale 0.1");
}

TEST(LossScaleRuleTest, HysteresisRefillsOnlyWhenTheScaleGrowsAsMegatron) {
  LossScaleRuleOptions o = torch_options(1000);
  o.hysteresis = 2;
  LossScaleRule rule(65536, o);
  // An overflow on every other step: the first is tolerated, then every one backs off
  // (Megatron's DynamicGradScaler falls to 128 over these 20 steps).
  std::vector<bool> alternating;
  for (int i = 0; i < 20; ++i) alternating.push_back(i % 2 == 0);
  scales_after(rule, alternating);
  EXPECT_EQ(rule.scale(), 128);
  // Growth refills the budget.
  LossScaleRuleOptions g = torch_options(2);
  g.hysteresis = 2;
  LossScaleRule grows(1024, g);
  EXPECT_EQ(scales_after(grows, {true, false, false, true, true}), (std::vector<double>{1024, 1024, 2048, 2048, 1024}));
}

TEST(LossScaleRuleTest, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaleRuleOptions o = torch_options(1000);
  o.hysteresis = 2;
  o.consecutive_hysteresis = true;  // DeepSpeed's consecutive_hysteresis=True
  LossScaleRule rule(65536, o);
  std::vector<bool> alternating;
  for (int i = 0; i < 20; ++i) alternating.push_back(i % 2 == 0);
  scales_after(rule, alternating);
  EXPECT_EQ(rule.scale(), 65536);  // never two in a row: never backs off
  EXPECT_EQ(scales_after(rule, {true, true, false}), (std::vector<double>{65536, 32768, 32768}));
  EXPECT_EQ(rule.hysteresis_left(), 2);
}

TEST(LossScaleRuleTest, ScalesAreRoundedToFloatAsTorchStoresThem) {
  LossScaleRuleOptions o = torch_options(1);
  o.growth_factor = 1.1;
  LossScaleRule rule(3.3, o);
  EXPECT_EQ(rule.scale(), static_cast<double>(3.3f));
  rule.update(false);
  EXPECT_EQ(rule.scale(), static_cast<double>(static_cast<float>(static_cast<double>(3.3f) * 1.1)));
}

} // namespace
