#pragma once
/// torch::nn::BatchNorm2d, with a faster training forward on the CPU that gives torch's bits.
///
/// torch 2.13's CPU kernel for a contiguous fp32 batch gathers each channel's mean and
/// variance in one sequential chain of double additions per channel: one addition waits for
/// the one before it, so the two passes run at a fraction of what the memory allows (on the
/// built-in CNN's [256, 16, 14, 14] activations, 0.54 ms a forward at 2 threads against 0.05 ms
/// for a sum over the same tensor; BENCHMARKS.md "BatchNorm's statistics"). This module runs
/// the same chains, each in the same order and the same precision, several channels at a time,
/// so the results are torch's to the bit: the output, the saved statistics the backward reads,
/// and the running statistics. The backward is torch's own kernel.
///
/// The fast path serves what torch's contiguous kernel serves: a module in training with its
/// affine parameters and running statistics, a contiguous [N, C, H, W] fp32 CPU input with more
/// than one channel and pixel, and no autocast or mixtrain dispatcher mode (fp16 emulation,
/// fp32 norms or islands, the op tracer) on the thread. Anything else is torch's forward. It
/// needs AVX2 and FMA (as torch's own kernels on such a CPU use them), and before its first use
/// in a process it runs once beside torch's kernel on a small batch and steps aside for good if
/// a single bit differs (another torch, another CPU). MIXTRAIN_TORCH_BATCH_NORM=1 turns it off.
///
/// A drop-in for torch::nn::BatchNorm2d in a C++ model: same options, parameters, buffers,
/// state_dict names and printout; code that looks for torch's class (dynamic_cast, `as<>`)
/// finds it. `clone()` gives torch's module back (Cloneable is torch's), with the same values.

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/pimpl.h>

namespace mixtrain::models {

class BatchNorm2dImpl : public torch::nn::BatchNorm2dImpl {
 public:
  using torch::nn::BatchNorm2dImpl::BatchNorm2dImpl;
  torch::Tensor forward(const torch::Tensor& input);
};
TORCH_MODULE(BatchNorm2d);

/// Whether `bn`'s next forward of `input` takes the fast path (the conditions above and the
/// process's probe).
bool batch_norm_fast_path_applies(const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& input);

} // namespace mixtrain::models
