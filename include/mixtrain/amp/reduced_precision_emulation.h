#pragma once
/// fp16 (and bf16) numerics on machines without them: emulation, not a silent no-op.
///
/// While a `ReducedPrecisionEmulation` guard is alive, the thread's ops compute what CUDA
/// autocast computes, rounded where a GPU rounds: values are stored in fp32,
/// and the emulation knows which tensors hold fp16 results.
/// - ops on autocast's fp16 list (conv*, linear, matmul, addmm, bmm, baddbmm,
///   einsum, RNN cells, ...): inputs rounded to half, computed in fp32 (a GPU's
///   fp32 accumulation), the result rounded to half;
/// - ops that autocast does not list, whose floating inputs are all fp16 results
///   (relu, gelu, add, mul by a scalar, residual adds, dropout, pooling, views,
///   batch_norm on an fp16 input): computed in fp32 on the half values, the
///   result rounded to half, since on a GPU it is a half tensor. In-place ops
///   on an fp16 result (x += y) round it in place;
/// - ops on autocast's fp32 list (softmax, log_softmax, layer_norm, the losses,
///   exp/log/pow, sum/cumsum, norms ...): fp32, not rounded, inner calls too;
/// - an fp16 result combined with an fp32 tensor (autocast's promote list such
///   as cat/stack, or any unlisted op): fp32, as torch's type promotion makes it;
/// - backward: the gradient reaching an fp16 result is rounded to half (autograd
///   makes half gradients for half tensors), and a weight's gradient leaves its
///   fp16 cast rounded, as autocast's cast-back does.
/// So forward overflow (> 65504 -> inf), gradient underflow (< 6e-8 -> 0) and the
/// loss-scale back-off happen as on a GPU, for any model: the mechanism sits in
/// libtorch's dispatcher, not in modules. With `dtype` BFloat16 the same rules
/// round through bfloat16 instead (bf16 numerics at close to fp32 speed on CPUs
/// whose bf16 autocast is slow).
///
/// Mechanism: a boxed fallback on the dispatcher's TESTING_ONLY_GenericMode key,
/// which sits above Autograd and Autocast, switched on for the thread by the
/// guard. Rounding is one fused, vectorized pass (F16C where the CPU has it),
/// in place on an op's fresh output.
///
/// Limits (documented, not hidden):
/// - An op that runs in fp16 is computed in fp32 and rounded once: a GPU kernel
///   that keeps half intermediates inside one op (a composite's inner steps)
///   rounds more often.
/// - Gradients are rounded once per fp16 tensor, after the contributions of all
///   its uses are summed in fp32; a GPU sums half gradients.
/// - Value-preserving ops (views, relu, max-pooling, cat of fp16 results) are
///   not rounded again: their outputs already hold half values.
/// - Out= overloads run unrounded, writing the caller's tensor, as CUDA
///   autocast leaves them alone.
/// - It uses a dispatch key that libtorch reserves for tests; a process that
///   registers its own fallback on that key cannot use emulation.

#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>

namespace mixtrain::amp {

/// RAII: emulation of `dtype` (Half or BFloat16) on for the current thread while alive. Nestable.
class ReducedPrecisionEmulation {
 public:
  explicit ReducedPrecisionEmulation(c10::ScalarType dtype = c10::ScalarType::Half);
  ~ReducedPrecisionEmulation();
  ReducedPrecisionEmulation(const ReducedPrecisionEmulation&) = delete;
  ReducedPrecisionEmulation& operator=(const ReducedPrecisionEmulation&) = delete;
  /// Whether emulation is on for the current thread.
  static bool is_enabled();
  /// The dtype emulated on this thread (Undefined when off).
  static c10::ScalarType dtype();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// x rounded through IEEE half (overflow to inf, underflow to 0) and back to
/// x's dtype; its gradient is rounded through half as well. Non-float32
/// tensors are returned unchanged.
torch::Tensor round_through_half(const torch::Tensor& x);
/// The same through `dtype` (Half or BFloat16).
torch::Tensor round_through(const torch::Tensor& x, c10::ScalarType dtype);

/// Rounds `n` floats through `dtype` (Half or BFloat16) and back, from `in` to
/// `out` (which may be `in`): one vectorized pass, threaded for large n. Bitwise
/// what `.to(dtype).to(kFloat)` gives, without the two copies.
void round_floats(const float* in, float* out, int64_t n, c10::ScalarType dtype);

/// Whether `t` holds an fp16 (or bf16) result of the emulation running on this
/// thread: the op that made it ran in the reduced precision.
bool holds_reduced_result(const torch::Tensor& t);

} // namespace mixtrain::amp
