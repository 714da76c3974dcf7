// The built-in transformer's attention on the CPU: bf16 heads of short sequences are
// computed in fp32 and rounded back (torch 2.13's bf16 flash attention is several times
// slower there), longer ones by torch's bf16 kernel, and fp32 as it is; the heads'
// gradients go back in one pass with autograd's own bits.
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

/// The gradients of the attention's input and of its weights, from `forward` given the
/// output's gradient `g`.
template <typename Forward>
std::vector<torch::Tensor> gradients(models::CausalSelfAttention& attn, const torch::Tensor& x, const torch::Tensor& g,
                                     Forward forward) {
  attn->zero_grad();
  const torch::Tensor input = x.detach().requires_grad_();
  forward(input).backward(g);
  std::vector<torch::Tensor> out{input.grad().clone()};
  for (const auto& p : attn->parameters()) out.push_back(p.grad().clone());
  return out;
}

TEST_F(TransformerModelTest, TheHeadsGradientsGoBackInOnePassWithAutogradsOwnBits) {
  // SplitHeads' backward writes each head's gradient into its place of the projection's
  // gradient (casting as it copies); autograd's backward of view -> permute -> unbind
  // (and of `to` in bf16) stacks, copies and casts apart. Every gradient is equal.
  struct Case {
    const char* name;
    c10::ScalarType dtype;
    int64_t tokens;
  };
  for (const Case& c : {Case{"fp32", torch::kFloat, 64}, Case{"bf16, fp32 heads", torch::kBFloat16, 64},
                        Case{"bf16, torch's bf16 kernel", torch::kBFloat16, 130}}) {
    SCOPED_TRACE(c.name);
    models::CausalSelfAttention attn(64, 4);
    attn->to(c.dtype);
    const torch::Tensor x = torch::randn({3, c.tokens, 64}).to(c.dtype);
    const torch::Tensor g = torch::randn({3, c.tokens, 64}).to(c.dtype);
    const bool fp32_heads = c.dtype == torch::kBFloat16 && c.tokens <= 128;
    const auto got = gradients(attn, x, g, [&](const torch::Tensor& in) { return attn->forward(in); });
    const auto expected = gradients(attn, x, g, [&](const torch::Tensor& in) {
      return by_hand(attn, in, 4, [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
        if (!fp32_heads) return sdpa(q, k, v);
        return sdpa(q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat)).to(torch::kBFloat16);
      });
    });
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].scalar_type(), c.dtype);
      EXPECT_TRUE(torch::equal(got[i], expected[i])) << "gradient " << i << " differs";
    }
    EXPECT_GT(got[0].abs().sum().item<double>(), 0.0);  // the input's gradient went through the heads
  }
}

} // namespace
