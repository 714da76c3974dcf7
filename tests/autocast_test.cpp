// The RAII autocast guard: enables, nests, restores (CPU bf16 here; CUDA in the GPU check).
#include "test_util.h"

#include <mixtrain/amp/autocast.h>
#include <mixtrain/compat.h>

namespace {

using mixtrain::amp::autocast;
namespace compat = mixtrain::compat;

TEST(AutocastTest, CpuBf16GuardNestsAndRestores) {
  const torch::Tensor a = torch::randn({4, 4}), b = torch::randn({4, 4});
  ASSERT_FALSE(compat::is_autocast_enabled(torch::kCPU));
  const auto dtype_before = compat::get_autocast_dtype(torch::kCPU);
  {
    autocast outer(torch::kCPU, torch::kBFloat16);
    EXPECT_TRUE(compat::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    {
      autocast inner(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
      EXPECT_FALSE(compat::is_autocast_enabled(torch::kCPU));
      EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
    }
    EXPECT_TRUE(compat::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(compat::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(compat::get_autocast_dtype(torch::kCPU), dtype_before);
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
  // The nesting count is back to zero: one more increment returns 1.
  EXPECT_EQ(compat::increment_nesting(), 1);
  EXPECT_EQ(compat::decrement_nesting(), 0);
}

TEST(AutocastTest, AutogradThroughAutocastGivesFp32Grads) {
  torch::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  const torch::Tensor x = torch::randn({2, 4});
  {
    autocast guard(torch::kCPU, torch::kBFloat16);
    torch::Tensor y = torch::mm(x, w);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    y.to(torch::kFloat).sum().backward();
  }
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat);
  EXPECT_THROW_WITH(compat::is_autocast_enabled(torch::kMeta), "autocast supports CPU and CUDA");
}

TEST(AutocastTest, CudaGuardWhenAvailable) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA";
  const torch::Tensor a = torch::randn({8, 8}, torch::kCUDA);
  autocast guard(torch::kCUDA, torch::kHalf);
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kHalf);
}

} // namespace

namespace {

TEST(AutocastTest, TheCacheFlagIsSetAndRestored) {
  compat::set_autocast_cache_enabled(false);
  {
    mixtrain::amp::autocast guard(torch::kCPU, torch::kBFloat16);  // torch.autocast's default: cache on
    EXPECT_TRUE(compat::is_autocast_cache_enabled());
    {
      mixtrain::amp::autocast uncached(torch::kCPU, torch::kBFloat16, true, /*cache_enabled=*/false);
      EXPECT_FALSE(compat::is_autocast_cache_enabled());
    }
    EXPECT_TRUE(compat::is_autocast_cache_enabled());
  }
  EXPECT_FALSE(compat::is_autocast_cache_enabled());
  compat::set_autocast_cache_enabled(true);
}

} // namespace
