#pragma once
/// Convolutions that run on channels-last (NHWC) activations, for the built-in image models.
///
/// torch 2.13's CPU convolution (oneDNN) is faster on channels-last activations than on
/// torch's default [N, C, H, W] layout, and on the default layout its backward computes the
/// input's gradient in channels-last anyway and copies it back (a `clone` inside
/// `convolution_backward`, 1 ms a step on the built-in CNN's second convolution at 2
/// threads). The built-in CNN's whole step took 0.79-0.91x the time with its activations
/// channels-last, in fp32 and bf16 (BENCHMARKS.md "The built-in CNN and ResNet on
/// channels-last activations").
///
/// Only activations change layout: the parameters (and so their gradients, the optimizer's
/// state, checkpoints and state_dict) stay torch's default contiguous layout, which is what
/// the optimizer core and the checkpoint format read. The arithmetic is torch's own kernels
/// on the other layout, which sum in another order: the numbers are not the default layout's
/// bits, they are what torch's own modules give the same state on a channels-last batch
/// (ChannelsLastTest).
/// MIXTRAIN_CONTIGUOUS_CONV=1 keeps the default layout (A/B, or the earlier bits).
///
/// - ChannelsLastConv2d: torch::nn::Conv2d whose forward first gives a 4-D input the
///   channels-last layout (a copy, or a restride for one channel); its output is then
///   channels-last, and BatchNorm, ReLU, pooling and additions after it keep that layout.
/// - ChannelsLastFlatten: torch::nn::Flatten that gives the gradient back in the layout its
///   input had. torch's flatten of a channels-last tensor copies it to the default layout and
///   its backward returns a default-layout gradient; the ReLU before it then mixes two
///   layouts in one elementwise pass, which took 1-2 ms where the same pass on one layout
///   takes 0.3 ms.
///
/// Both are drop-ins: the same options, parameters and printout as torch's modules, found by
/// `as<torch::nn::Conv2d>()`; `clone()` gives torch's module back.

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace mixtrain::models {

/// Whether the built-in image models run their activations channels-last: yes unless
/// MIXTRAIN_CONTIGUOUS_CONV=1 (read once per process).
bool channels_last_activations();

/// `x` in the channels-last layout when it is a 4-D CPU tensor and channels_last_activations(),
/// otherwise `x` (a GPU batch keeps its layout: the gain was measured on oneDNN only).
/// Differentiable; no copy when `x` is channels-last already.
torch::Tensor to_channels_last(const torch::Tensor& x);

class ChannelsLastConv2dImpl : public torch::nn::Conv2dImpl {
 public:
  using torch::nn::Conv2dImpl::Conv2dImpl;
  torch::Tensor forward(const torch::Tensor& input);
};
TORCH_MODULE(ChannelsLastConv2d);

class ChannelsLastFlattenImpl : public torch::nn::FlattenImpl {
 public:
  using torch::nn::FlattenImpl::FlattenImpl;
  torch::Tensor forward(const torch::Tensor& input);
};
TORCH_MODULE(ChannelsLastFlatten);

} // namespace mixtrain::models
