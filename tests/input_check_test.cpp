// Input checks: NaN/Inf, raw 0-255 pixels, unnormalized tabular features.
#include "test_util.h"

#include <mixtrain/diagnose/input_check.h>

namespace {

using namespace mixtrain;
class InputCheckTest : public test::SeededTest {};

TEST_F(InputCheckTest, NormalizedDataPasses) {
  const auto r = diagnose::check_inputs(torch::randn({256, 1, 8, 8}));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.nonfinite, 0);
  EXPECT_FALSE(r.unnormalized);
  EXPECT_NEAR(r.mean, 0, 0.05);
  EXPECT_NEAR(r.std, 1, 0.05);
}

TEST_F(InputCheckTest, RawPixelsAreFlagged) {
  const torch::Tensor pixels = torch::randint(0, 256, {64, 1, 28, 28}).to(torch::kFloat);
  const auto r = diagnose::check_inputs(pixels);
  EXPECT_TRUE(r.raw_pixels);
  EXPECT_TRUE(r.unnormalized);
  ASSERT_EQ(r.findings.size(), 1u);
  EXPECT_NE(r.findings[0].find("raw 0-255 pixels"), std::string::npos) << r.findings[0];
  // The same pixels divided by 255 are in [0, 1]: not raw, and mean/std within bounds.
  EXPECT_TRUE(diagnose::check_inputs(pixels / 255).ok());
}

TEST_F(InputCheckTest, NanAndInfAreCounted) {
  torch::Tensor x = torch::randn({10, 4});
  x[2][1] = NAN;
  x[5][3] = INFINITY;
  const auto r = diagnose::check_inputs(x);
  EXPECT_EQ(r.nonfinite, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.findings[0].find("2 of 40 input values are NaN or Inf"), std::string::npos) << r.findings[0];
  EXPECT_TRUE(std::isfinite(r.mean));  // statistics over the finite values
}

TEST_F(InputCheckTest, OneUnscaledTabularFeatureIsNamed) {
  torch::Tensor x = torch::randn({200, 5});
  x.select(1, 3).mul_(5000).add_(20000);  // e.g. a salary column
  const auto r = diagnose::check_inputs(x);
  EXPECT_TRUE(r.unnormalized);
  ASSERT_EQ(r.findings.size(), 1u);
  EXPECT_NE(r.findings[0].find("feature 3"), std::string::npos) << r.findings[0];
}

TEST_F(InputCheckTest, NonFloatOrEmptyInputsAreNotJudged) {
  EXPECT_TRUE(diagnose::check_inputs(torch::randint(0, 5, {4, 4})).ok());
  EXPECT_TRUE(diagnose::check_inputs(torch::empty({0, 3})).ok());
}

} // namespace
