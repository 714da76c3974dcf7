// The built-in transformer's attention on the CPU: bf16 heads of short sequences are
// computed in fp32 and rounded back (torch 2.13's bf16 flash attention is several times
// slower there), longer ones by torch's bf16 kernel, and fp32 as it is.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;

class TransformerModelTest : public test::SeededTest {
 protected:
  /// The attention's output computed by hand from its weights: `attend` takes the
  /// [B, H, T, D] heads.
  template <typename Attend>
  static torch::Tensor by_hand(models::CausalSelfAttention& attn, const torch::Tensor& x, int64_t heads, Attend attend) {
    const auto p = attn->named_parameters();
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    const auto parts = at::linear(x, p["qkv.weight"], p["qkv.bias"])
                           .view({b, t, 3, heads, c / heads})
                           .permute({2, 0, 3, 1, 4})
                           .unbind(0);
    const torch::Tensor y = attend(parts[0], parts[1], parts[2]);
    return at::linear(y.transpose(1, 2).reshape({b, t, c}), p["proj.weight"], p["proj.bias"]);
  }
  static torch::Tensor sdpa(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  }
};

TEST_F(TransformerModelTest, ShortBf16AttentionOnTheCpuIsComputedInFp32AndRoundedBack) {
  torch::NoGradGuard no_grad;
  models::CausalSelfAttention attn(64, 4);
  attn->to(torch::kBFloat16);
  const torch::Tensor x = torch::randn({4, 64, 64}).to(torch::kBFloat16);
  const torch::Tensor got = attn->forward(x);
  ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
  const torch::Tensor via_fp32 = by_hand(attn, x, 4, [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return sdpa(q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat)).to(torch::kBFloat16);
  });
  const torch::Tensor bf16_kernel = by_hand(attn, x, 4, sdpa);
  EXPECT_TRUE(torch::equal(got, via_fp32));
  EXPECT_FALSE(torch::equal(got, bf16_kernel));  // the two paths differ here, so the test tells them apart
}

TEST_F(TransformerModelTest, Bf16AutocastTakesTheSameFp32AttentionOnTheCpu) {
  torch::NoGradGuard no_grad;
  models::CausalSelfAttention attn(64, 4);
  const torch::Tensor x = torch::randn({4, 64, 64});
  torch::Tensor got, expected;
  {
    const amp::autocast bf16(c10::DeviceType::CPU, torch::kBFloat16);
    got = attn->forward(x);
  }
  {
    // Autocast's own parts by hand: the projections in bf16, the attention outside it.
    const torch::Tensor w = attn->named_parameters()["qkv.weight"], pw = attn->named_parameters()["proj.weight"];
    const auto parts = at::linear(x.to(torch::kBFloat16), w.to(torch::kBFloat16),
                                  attn->named_parameters()["qkv.bias"].to(torch::kBFloat16))
                           .view({4, 64, 3, 4, 16})
                           .permute({2, 0, 3, 1, 4})
                           .unbind(0);
    const torch::Tensor y =
        sdpa(parts[0].to(torch::kFloat), parts[1].to(torch::kFloat), parts[2].to(torch::kFloat)).to(torch::kBFloat16);
    expected = at::linear(y.transpose(1, 2).reshape({4, 64, 64}), pw.to(torch::kBFloat16),
                          attn->named_parameters()["proj.bias"].to(torch::kBFloat16));
  }
  EXPECT_TRUE(torch::equal(got, expected));
}

TEST_F(TransformerModelTest, LongBf16AttentionAndFp32AttentionRunTorchsKernelAsTheyAre) {
  torch::NoGradGuard no_grad;
  models::CausalSelfAttention attn(64, 4);
  const torch::Tensor x = torch::randn({2, 130, 64});
  EXPECT_TRUE(torch::equal(attn->forward(x), by_hand(attn, x, 4, sdpa)));
  attn->to(torch::kBFloat16);
  const torch::Tensor xb = x.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(attn->forward(xb), by_hand(attn, xb, 4, sdpa)));
}

} // namespace
