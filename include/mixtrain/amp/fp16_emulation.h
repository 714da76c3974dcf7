#pragma once
/// fp16 numerics on machines without CUDA: emulation, not a silent no-op.
///
/// While an `Fp16Emulation` guard is alive, every op that CUDA autocast would
/// run in fp16 (its lower-precision list: conv*, linear, matmul, mm, addmm,
/// bmm, baddbmm, einsum, RNN cells, ...) gets its floating-point inputs and
/// outputs rounded through IEEE half, and the gradients flowing back through it
/// rounded through half too. So forward overflow (> 65504 -> inf), gradient
/// underflow (< 6e-8 -> 0) and the loss-scale back-off happen as on a GPU,
/// for any model: the mechanism sits in libtorch's dispatcher, not in modules.
///
/// Mechanism: a boxed fallback on the dispatcher's TESTING_ONLY_GenericMode key,
/// which sits above Autograd and Autocast, switched on for the thread by the
/// guard. A listed op is redispatched with the key excluded (its inner ops are
/// not rounded again, as with autocast); other ops pass straight through.
///
/// Limits (documented, not hidden):
/// - Only the listed ops round. Elementwise ops between them (add, relu,
///   batch_norm, ...) run in fp32, so an overflow that real fp16 would hit in,
///   say, a residual add of two large activations is not reproduced.
/// - Arithmetic inside a listed op is fp32 on half-rounded inputs (like a GPU's
///   fp32 accumulation); the result is then rounded to half.
/// - No speed-up: it is for checking fp16 safety. Measured slow-down in BENCHMARKS.md.
/// - It uses a dispatch key that libtorch reserves for tests; a process that
///   registers its own fallback on that key cannot use emulation.

#include <torch/types.h>

#include <memory>

namespace mixtrain::amp {

/// RAII: fp16 emulation on for the current thread while alive. Nestable.
class Fp16Emulation {
 public:
  Fp16Emulation();
  ~Fp16Emulation();
  Fp16Emulation(const Fp16Emulation&) = delete;
  Fp16Emulation& operator=(const Fp16Emulation&) = delete;
  /// Whether emulation is on for the current thread.
  static bool is_enabled();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// x rounded through IEEE half (overflow to inf, underflow to 0) and back to
/// x's dtype; its gradient is rounded through half as well. Non-float32
/// tensors are returned unchanged.
torch::Tensor round_through_half(const torch::Tensor& x);

} // namespace mixtrain::amp
