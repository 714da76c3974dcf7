#pragma once
/// The model zoo: the built-in models of the CLI, the demo, the benchmarks and
/// the doctor, as libtorch modules. Which name builds which, with its default data
/// and threads, is the run layer's registry (mixtrain/run/model_registry.h).

#include "mixtrain/models/batch_norm.h"
#include "mixtrain/models/model.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

namespace torch::nn { class Module; }

namespace mixtrain::models {

/// conv(1->16, 3, stride 2, pad 1)+BN+ReLU, conv(16->32, 3, stride 2, pad 1)+BN+ReLU,
/// flatten, linear(1568->10). Convolutions have no bias: BatchNorm follows (fastai's ConvLayer).
torch::nn::Sequential simple_cnn();
/// flatten, linear(784->256), ReLU, linear(256->10).
torch::nn::Sequential mlp();

/// A residual block: conv3x3-BN-ReLU-conv3x3-BN plus the input (through a 1x1
/// conv + BN when the stride or width changes), then ReLU. The residual add of
/// two fp16 activations is where real fp16 ResNets overflow.
class ResBlockImpl : public torch::nn::Module {
 public:
  ResBlockImpl(int64_t in, int64_t out, int64_t stride);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, shortcut_conv{nullptr};
  BatchNorm2d bn1{nullptr}, bn2{nullptr}, shortcut_bn{nullptr};
};
TORCH_MODULE(ResBlock);

/// A small ResNet for 28x28 one-channel images: stem conv(1->16)+BN+ReLU, residual
/// blocks 16 -> 32 (stride 2) -> 64 (stride 2), global average pool, linear(64->10).
torch::nn::Sequential resnet();

/// The built-in transformer's shape: a character-level model over bytes.
struct TransformerOptions {
  TORCH_ARG(int64_t, vocab) = 256;
  TORCH_ARG(int64_t, context) = 64;
  TORCH_ARG(int64_t, d_model) = 128;
  TORCH_ARG(int64_t, heads) = 4;
  TORCH_ARG(int64_t, layers) = 2;
};

/// Causal multi-head self-attention (q, k, v from one linear; torch's fused scaled_dot_product_attention).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int64_t d_model, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t heads_;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

/// Pre-norm decoder block: x + attn(LN(x)), then x + fc2(GELU(fc1(LN(x)))) with a 4x wide MLP.
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(int64_t d_model, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// A decoder-only language model (GPT-style): token and position embeddings,
/// `layers` TransformerBlocks, a final LayerNorm and a linear head. Tokens [N, T]
/// (T <= context) -> logits [N, T, vocab].
class TransformerLMImpl : public torch::nn::Module {
 public:
  explicit TransformerLMImpl(TransformerOptions options = {});
  torch::Tensor forward(const torch::Tensor& tokens);
  const TransformerOptions& options() const { return options_; }

 private:
  TransformerOptions options_;
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TransformerLM);

} // namespace mixtrain::models
