#pragma once
/// Fused gradient unscale + non-finite check.
///
/// One pass over each gradient: every element is multiplied by `inv_scale` and
/// checked for inf/NaN (the check looks at the value before multiplying, as
/// ATen's kernel does). libtorch < 2.3 has no CPU kernel for
/// `_amp_foreach_non_finite_check_and_unscale_`, and the naive
/// `mul_` + `isfinite().all()` reads memory twice and allocates a mask, which
/// measured ~40x slower here; this kernel runs at `mul_` bandwidth.

#include <torch/types.h>

#include <vector>

namespace mixtrain::amp {

/// Multiplies every tensor in `grads` by `inv_scale` in place (skipped when
/// inv_scale == 1) and returns true when any element was inf or NaN.
/// CPU tensors of float, double, half or bfloat16; undefined tensors are ignored.
/// Vectorized and parallel over all elements of all tensors.
bool non_finite_check_and_unscale_cpu(const std::vector<torch::Tensor>& grads, float inv_scale);

/// Device-generic form with ATen's signature: CUDA tensors go to ATen's fused
/// `_amp_foreach_non_finite_check_and_unscale_`, CPU tensors to the kernel above.
/// `found_inf` (a 1-element float tensor on the grads' device) is set to 1 on
/// inf/NaN and never reset; `inv_scale` is a 1-element float tensor.
void non_finite_check_and_unscale_(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf,
                                   const torch::Tensor& inv_scale);

/// True when any element of `tensors` is inf or NaN, in one read-only pass and
/// one host read (non_finite_flag, read).
bool has_non_finite(const std::vector<torch::Tensor>& tensors);
/// has_non_finite without the host read: a float tensor [1] (1: some element is
/// inf/NaN) on the tensors' device, for a caller that reads it with other values.
torch::Tensor non_finite_flag(const std::vector<torch::Tensor>& tensors);

} // namespace mixtrain::amp
