// The fused CPU unscale + non-finite check against the naive reference.
#include "test_util.h"

#include <mixtrain/amp/unscale.h>

namespace {

using mixtrain::amp::has_non_finite;
using mixtrain::amp::non_finite_check_and_unscale_cpu;

class UnscaleTest : public mixtrain::test::SeededTest {};

TEST_F(UnscaleTest, MatchesMulAndDetectsNonFiniteAnywhere) {
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    // Sizes straddle the 65536-element chunk boundary; one tensor is non-contiguous.
    std::vector<torch::Tensor> grads = {torch::randn({3}, dtype), torch::randn({65536 + 7}, dtype),
                                        torch::randn({40, 30}, dtype).t()};
    std::vector<torch::Tensor> expected;
    for (auto& g : grads) expected.push_back(g.to(torch::kFloat) * 0.25f);
    EXPECT_FALSE(non_finite_check_and_unscale_cpu(grads, 0.25f)) << dtype;
    for (size_t i = 0; i < grads.size(); ++i)
      EXPECT_TRUE(torch::allclose(grads[i].to(torch::kFloat), expected[i], 1e-2, 1e-6)) << dtype << " " << i;

    for (double bad : {INFINITY, -INFINITY, NAN}) {
      grads[1][65536 + 6] = bad;  // the very last element, in the last chunk
      EXPECT_TRUE(non_finite_check_and_unscale_cpu(grads, 0.5f)) << dtype << " " << bad;
      EXPECT_TRUE(has_non_finite(grads));
      grads[1][65536 + 6] = 0;
      EXPECT_FALSE(has_non_finite(grads));
    }
    grads[2][5][3] = INFINITY;  // in the non-contiguous one
    EXPECT_TRUE(non_finite_check_and_unscale_cpu(grads, 1.0f)) << dtype;
  }
}

TEST_F(UnscaleTest, LargeFiniteValuesAreNotFlagged) {
  std::vector<torch::Tensor> grads = {torch::full({10}, 3.0e38f), torch::full({10}, 65504.0, torch::kHalf)};
  EXPECT_FALSE(non_finite_check_and_unscale_cpu(grads, 1.0f));
  EXPECT_FALSE(has_non_finite({torch::Tensor(), grads[0]}));  // undefined tensors are ignored
  EXPECT_THROW_WITH(non_finite_check_and_unscale_cpu({torch::zeros({2}, torch::kInt)}, 1.0f), "unsupported dtype");
}

} // namespace
