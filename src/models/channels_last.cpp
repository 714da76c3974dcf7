// Channels-last activations for the built-in image models: the layout change at the first
// convolution and its undoing at the flatten, with a gradient in the layout each side uses.
#include "mixtrain/models/channels_last.h"
#include "util/env_switch.h"

#include <torch/autograd.h>

namespace mixtrain::models {

using torch::Tensor;

bool channels_last_activations() {
  static const bool on = !mixtrain::detail::env_equals("MIXTRAIN_CONTIGUOUS_CONV", "1");
  return on;
}

namespace {

/// Whether torch's kernels treat `x` as channels-last: for one channel a default-layout
/// tensor is channels-last contiguous too, but a convolution still runs it (and so writes its
/// output) in the default layout, so this asks for channels-last strides.
bool runs_channels_last(const Tensor& x) { return x.suggest_memory_format() == at::MemoryFormat::ChannelsLast; }

/// flatten(x) for a channels-last x: its values in the default layout's order (what a
/// Linear after it was built for), and a backward that gives the gradient back channels-last,
/// so that the elementwise backward before it (a ReLU's) reads two tensors of one layout.
struct FlattenChannelsLast : torch::autograd::Function<FlattenChannelsLast> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, int64_t start, int64_t end) {
    ctx->saved_data["sizes"] = x.sizes().vec();
    return x.contiguous().flatten(start, end);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    return {grads[0].reshape(sizes).contiguous(at::MemoryFormat::ChannelsLast), Tensor(), Tensor()};
  }
};

} // namespace

Tensor to_channels_last(const Tensor& x) {
  // CPU only: the gain is oneDNN's, measured here; cuDNN's fp32 convolutions were not
  // measured on channels-last, so a GPU batch keeps the layout it was given.
  if (x.dim() != 4 || !x.is_cpu() || !channels_last_activations() || runs_channels_last(x)) return x;
  // One channel in the default layout holds its values in channels-last order already: new
  // strides say so without a copy (a batch of images; a tensor that needs a gradient is
  // copied, as as_strided's backward is a scatter).
  if (x.size(1) == 1 && x.is_contiguous() && !x.requires_grad())
    return x.as_strided(x.sizes(), {x.stride(0), 1, x.stride(2), x.stride(3)}, x.storage_offset());
  return torch::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::ChannelsLast)).copy_(x);
}

Tensor ChannelsLastConv2dImpl::forward(const Tensor& input) { return torch::nn::Conv2dImpl::forward(to_channels_last(input)); }

Tensor ChannelsLastFlattenImpl::forward(const Tensor& input) {
  if (input.dim() != 4 || !runs_channels_last(input) || input.is_contiguous()) return torch::nn::FlattenImpl::forward(input);
  return FlattenChannelsLast::apply(input, options.start_dim(), options.end_dim());
}

} // namespace mixtrain::models
