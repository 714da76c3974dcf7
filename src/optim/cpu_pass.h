#pragma once
// The optimizer core's own arithmetic on the CPU (private to src/optim): the fused Adam
// pass, and the square root every optimizer of the core takes.
//
// Why the core has its own root: torch's CPU sqrt goes to MKL's vector math, which is not
// correctly rounded (17% of the roots of 1M random floats an ulp off). A pass that takes
// the root in registers cannot give MKL's bits, and leaving the root to ATen cost more
// than torch's whole fused step. So the core's root is IEEE's, correctly rounded: what a
// CUDA device, torch's fused CPU kernels and `vsqrtps` compute. Everything else is
// torch.optim's single-tensor arithmetic, element for element.

#include "mixtrain/optim/update_rule.h"

#include <cstdint>

namespace mixtrain::optim::detail {

/// The correctly rounded square root of an fp32 tensor (a new tensor). On another device
/// or dtype: torch's own sqrt (a CUDA device's is correctly rounded).
torch::Tensor sqrt_correctly_rounded(const torch::Tensor& t);

/// One step's Adam/AdamW scalars, as torch.optim computes them in double and ATen
/// narrows them to fp32 at each op.
struct AdamScalars {
  bool decoupled_decay = false;  ///< AdamW: p *= decay_factor
  bool coupled_decay = false;    ///< Adam: g += weight_decay * p
  bool amsgrad = false, maximize = false;
  float decay_factor = 1, weight_decay = 0;
  float lerp_weight = 0.1f;  ///< 1 - beta1
  float beta2 = 0.999f, sq_coefficient = 0.001f;  ///< beta2, 1 - beta2
  float bias_correction2_sqrt = 1, eps = 1e-8f;
  float neg_step_size = -1e-3f;  ///< -lr / bias_correction1
};
AdamScalars adam_scalars(const UpdateRule& rule, int64_t step);

/// A tensor's span: its data at the span's first element, fp32 or bf16.
struct Operand {
  void* data = nullptr;
  bool bf16 = false;
};

/// Adam's step on `n` contiguous elements, in one pass: reads the weight, gradient and
/// state, writes the state back in its own dtype (bf16: to nearest) and the new weight:
///   - into `param` itself when it is fp32 (new_weight == nullptr);
///   - else into `new_weight[0..n)` in fp32, the weight before the step into `old_weight`,
///     for the caller to round by its rule.
/// The moments (and `max_sq`, read only with amsgrad) share one dtype; a bf16 weight
/// comes with `new_weight`, an fp32 one without. AVX2+FMA where the CPU has them, else the
/// same arithmetic one element at a time: the bits do not depend on the CPU
/// (MIXTRAIN_CPU_AVX2=0 forces the element path, for tests). An AVX-512 path was tried: no
/// faster on 10M parameters, memory-bound.
void adam_span(const AdamScalars& s, int64_t n, Operand param, Operand grad, Operand exp_avg, Operand exp_avg_sq,
               Operand max_sq, float* new_weight, float* old_weight);

/// Whether the passes here run their AVX2+FMA loops now: the CPU has them and
/// MIXTRAIN_CPU_AVX2 is not "0" (read at each call).
bool cpu_pass_vectorized();

/// Writes fp32 values that are bf16 values already into bf16 storage (to nearest: exact).
void store_bf16(const float* from, void* to, int64_t n);
/// Widens bf16 storage to fp32 (exact).
void load_bf16(const void* from, float* to, int64_t n);

} // namespace mixtrain::optim::detail
