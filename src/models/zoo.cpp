#include "mixtrain/models/zoo.h"

#include "mixtrain/models/channels_last.h"
#include "mixtrain/models/module_scope.h"
#include "mixtrain/models/scripted_model.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/nn.h>

namespace mixtrain::models {

namespace nn = torch::nn;

namespace {

/// `m`'s forward as Python's nn.Linear computes it: ATen's linear, which runs a contiguous
/// [B, T, C] input as one addmm with the bias in the product (and under autocast casts the
/// bias with the weight). libtorch's nn::Linear decomposes anything but a 2-D input into
/// matmul and an in-place `+= bias`: under CPU bf16 autocast that adds an fp32 bias into
/// a bf16 result through fp32, and the transformer's forward took 1.19x Python's
/// (bench/step_ops.cpp, BENCHMARKS.md "Where a step goes").
torch::Tensor linear(const nn::Linear& m, const torch::Tensor& x) { return at::linear(x, m->weight, m->bias); }

/// Sequences up to this long: torch 2.13's CPU flash attention is faster in fp32 than in bf16.
constexpr int64_t kCpuBf16AttentionFp32UpTo = 128;

/// [B, T, 3C] -> the three [B, H, T, C/H] heads q, k and v, as view -> permute -> unbind
/// gives them (as `dtype` copies where that is not the input's). Autograd's backward of
/// that chain stacks the three heads' gradients into a new tensor and copies it once
/// more to make it [B, T, 3C] again (the step's `cat` and a `copy_`, each a pass over
/// the projection's gradient, in every layer), and in bf16 casts each head's gradient
/// first. This backward writes each head's gradient into its place in one [B, T, 3C]
/// tensor, casting as it copies: one pass, and the same bits (a copy; a cast rounds as
/// `to` does).
struct SplitHeads : torch::autograd::Function<SplitHeads> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qkv,
                                                int64_t heads, c10::ScalarType dtype) {
    const std::vector<int64_t> shape{qkv.size(0), qkv.size(1), 3, heads, qkv.size(2) / 3 / heads};
    ctx->saved_data["shape"] = shape;
    ctx->saved_data["dtype"] = static_cast<int64_t>(qkv.scalar_type());
    auto parts = qkv.view(shape).permute({2, 0, 3, 1, 4}).unbind(0);
    if (dtype != qkv.scalar_type())
      for (auto& p : parts) p = p.to(dtype);
    return {parts[0], parts[1], parts[2]};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    torch::Tensor grad;
    for (size_t i = 0; i < 3; ++i)
      if (grads[i].defined()) grad = grads[i];
    TORCH_INTERNAL_ASSERT(grad.defined(), "SplitHeads: a backward with no head gradient");
    for (auto& g : grads)
      if (!g.defined()) g = at::zeros_like(grad);  // a head the loss did not reach, as unbind's backward fills it
    // One op into the [B, T, 3, H, D] layout seen as the three heads' [3, B, H, T, D]: each
    // head's gradient is copied (and cast) into its place.
    torch::Tensor out = at::empty(shape, grad.options().dtype(dtype));
    torch::Tensor heads = out.permute({2, 0, 3, 1, 4});
    at::stack_out(heads, grads, 0);
    return {out.view({shape[0], shape[1], 3 * shape[3] * shape[4]}), torch::Tensor(), torch::Tensor()};
  }
};

/// Causal attention over [B, H, T, D] heads. On the CPU, torch 2.13's bf16 flash-attention
/// kernels cost a fixed amount per batch and head that its fp32 ones do not (a few
/// allocations each, thousands a step): forward and backward over 64 tokens in bf16 took
/// 4.1x the fp32 time, over 128 tokens 1.3-2.8x; from 256 tokens with 64-dim heads bf16
/// wins (bench/cpu_attention.py, BENCHMARKS.md "Where a step goes"). So short sequences'
/// bf16 heads are computed in fp32, outside autocast, and the result is rounded back to
/// bf16: the reduced-precision emulation's own model of attention (bf16 in, bf16 out), and
/// more accurate than the bf16 kernel, which also rounds its softmax to bf16.
///
/// `qkv` is the [B, T, 3C] projection; SplitHeads gives the heads (in fp32 where they are
/// computed so).
torch::Tensor causal_attention(const torch::Tensor& qkv, int64_t heads) {
  if (qkv.is_cpu() && qkv.scalar_type() == torch::kBFloat16 && qkv.size(1) <= kCpuBf16AttentionFp32UpTo) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const auto h = SplitHeads::apply(qkv, heads, torch::kFloat);
    return at::scaled_dot_product_attention(h[0], h[1], h[2], /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true)
        .to(torch::kBFloat16);
  }
  const auto h = SplitHeads::apply(qkv, heads, qkv.scalar_type());
  return at::scaled_dot_product_attention(h[0], h[1], h[2], /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
}

} // namespace

torch::nn::Sequential simple_cnn() {
  // Its activations run channels-last from the first convolution to the flatten
  // (channels_last.h says why).
  return nn::Sequential(
      ChannelsLastConv2d(nn::Conv2dOptions(1, 16, 3).stride(2).padding(1).bias(false)), BatchNorm2d(16), nn::ReLU(),
      nn::Conv2d(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1).bias(false)), BatchNorm2d(32), nn::ReLU(),
      ChannelsLastFlatten(), nn::Linear(32 * 7 * 7, 10));
}

torch::nn::Sequential mlp() {
  return nn::Sequential(nn::Flatten(), nn::Linear(28 * 28, 256), nn::ReLU(), nn::Linear(256, 10));
}

ResBlockImpl::ResBlockImpl(int64_t in, int64_t out, int64_t stride) {
  const auto conv = [](int64_t i, int64_t o, int64_t k, int64_t s) {
    return nn::Conv2d(nn::Conv2dOptions(i, o, k).stride(s).padding(k / 2).bias(false));
  };
  conv1 = register_module("conv1", conv(in, out, 3, stride));
  bn1 = register_module("bn1", BatchNorm2d(out));
  conv2 = register_module("conv2", conv(out, out, 3, 1));
  bn2 = register_module("bn2", BatchNorm2d(out));
  if (stride != 1 || in != out) {
    shortcut_conv = register_module("shortcut_conv", conv(in, out, 1, stride));
    shortcut_bn = register_module("shortcut_bn", BatchNorm2d(out));
  }
}

torch::Tensor ResBlockImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = bn2(conv2(torch::relu(bn1(conv1(x)))));
  return torch::relu(h + (shortcut_conv ? shortcut_bn(shortcut_conv(x)) : x));
}

torch::nn::Sequential resnet() {
  // Channels-last activations from the stem on, as in simple_cnn().
  return nn::Sequential(ChannelsLastConv2d(nn::Conv2dOptions(1, 16, 3).padding(1).bias(false)), BatchNorm2d(16),
                        nn::ReLU(), ResBlock(16, 16, 1), ResBlock(16, 32, 2), ResBlock(32, 64, 2),
                        nn::AdaptiveAvgPool2d(1), ChannelsLastFlatten(), nn::Linear(64, 10));
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int64_t d_model, int64_t heads) : heads_(heads) {
  TORCH_CHECK(heads > 0 && d_model % heads == 0, "d_model ", d_model, " is not divisible by heads ", heads);
  qkv = register_module("qkv", nn::Linear(d_model, 3 * d_model));
  proj = register_module("proj", nn::Linear(d_model, d_model));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const torch::Tensor y = causal_attention(linear(qkv, x), heads_);  // [B, H, T, C/H]
  return linear(proj, y.transpose(1, 2).reshape({b, t, c}));
}

TransformerBlockImpl::TransformerBlockImpl(int64_t d_model, int64_t heads) {
  ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({d_model})));
  attn = register_module("attn", CausalSelfAttention(d_model, heads));
  ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({d_model})));
  fc1 = register_module("fc1", nn::Linear(d_model, 4 * d_model));
  fc2 = register_module("fc2", nn::Linear(4 * d_model, d_model));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x) {
  // Scopes name the module boundaries that parameter-free ops run in (the attention scores).
  torch::Tensor a;
  {
    const ModuleScope scope("attn");
    a = attn(ln1(x));
  }
  const torch::Tensor h = x + a;
  return h + linear(fc2, torch::gelu(linear(fc1, ln2(h))));
}

TransformerLMImpl::TransformerLMImpl(TransformerOptions o) : options_(o) {
  tok = register_module("tok", nn::Embedding(o.vocab(), o.d_model()));
  pos = register_module("pos", nn::Embedding(o.context(), o.d_model()));
  blocks = register_module("blocks", nn::ModuleList());
  for (int64_t i = 0; i < o.layers(); ++i) blocks->push_back(TransformerBlock(o.d_model(), o.heads()));
  ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({o.d_model()})));
  head = register_module("head", nn::Linear(o.d_model(), o.vocab()));
  // GPT-2's initialization: small normal weights keep the residual stream's scale stable.
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters())
    if (p.key().find("ln") == std::string::npos) {
      if (p.value().dim() >= 2) p.value().normal_(0, 0.02);
      else p.value().zero_();
    }
}

torch::Tensor TransformerLMImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2 && !tokens.is_floating_point(), "The transformer takes integer tokens [N, T], got ",
              tokens.scalar_type(), " ", tokens.sizes());
  const int64_t t = tokens.size(1);
  TORCH_CHECK(t <= options_.context(), "The transformer's context is ", options_.context(), " tokens, got ", t);
  torch::Tensor x = tok(tokens) + pos(torch::arange(t, tokens.options().dtype(torch::kLong)));
  for (size_t i = 0; i < blocks->size(); ++i) {
    const ModuleScope scope("blocks." + std::to_string(i));
    x = blocks[i]->as<TransformerBlock>()->forward(x);
  }
  return linear(head, ln_f(x));
}

} // namespace mixtrain::models
