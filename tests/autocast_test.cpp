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

namespace {

// nn.MultiheadAttention's and nn.TransformerEncoderLayer's eval fast paths call these
// fused kernels with an activation autocast made bf16 and the module's fp32 weights.
/// A small random weight (the caller seeds it).
torch::Tensor w(int64_t rows, int64_t cols) { return torch::randn({rows, cols}) * 0.1; }

torch::Tensor fused_attention(const torch::Tensor& x) {
  const int64_t d = x.size(-1);
  torch::manual_seed(0);
  return std::get<0>(at::_native_multi_head_attention(x, x, x, d, /*num_head=*/2, w(3 * d, d), torch::zeros({3 * d}),
                                                       w(d, d), torch::zeros({d}), {}, /*need_weights=*/false));
}

torch::Tensor fused_encoder_layer(const torch::Tensor& x) {
  const int64_t d = x.size(-1);
  torch::manual_seed(0);
  return at::_transformer_encoder_layer_fwd(x, d, /*num_heads=*/2, w(3 * d, d), torch::zeros({3 * d}), w(d, d),
                                            torch::zeros({d}), /*use_gelu=*/false, /*norm_first=*/false, 1e-5,
                                            torch::ones({d}), torch::zeros({d}), torch::ones({d}), torch::zeros({d}),
                                            w(2 * d, d), torch::zeros({2 * d}), w(d, 2 * d), torch::zeros({d}));
}

TEST(AutocastTest, FusedAttentionKernelsRunUnderCpuAutocastInTheAutocastDtype) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({2, 5, 8});
  const torch::Tensor activation = x.to(torch::kBFloat16);  // what a linear before it returns under autocast
  // Outside autocast the mismatch is an error: these kernels take one dtype.
  EXPECT_THROW(fused_attention(activation), c10::Error);
  EXPECT_THROW(fused_encoder_layer(activation), c10::Error);
  autocast guard(torch::kCPU, torch::kBFloat16);
  for (const auto& run : {fused_attention, fused_encoder_layer}) {
    const torch::Tensor y = run(activation);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    // bf16's rounding of the fp32 result, not something else.
    torch::Tensor reference;
    {
      autocast off(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
      reference = run(x);
    }
    const double scale = reference.abs().max().item<double>();
    EXPECT_GT(scale, 0.01);
    EXPECT_LT((y.to(torch::kFloat) - reference).abs().max().item<double>(), 0.05 * scale);
  }
}

} // namespace
