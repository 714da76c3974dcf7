#pragma once
/// Gradient health: how much of each parameter's gradient fp16 would lose at a
/// given loss scale.

#include "mixtrain/data/data.h"

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain {
class Learner;
}

namespace mixtrain::diagnose {

/// Smallest positive fp16 value (a subnormal, 2^-24): scaled gradients below
/// half of it round to zero.
constexpr double kFp16MinSubnormal = 5.960464477539063e-08;

struct ParamGradHealth {
  std::string name;
  int64_t numel = 0;
  int64_t nonzero = 0;          ///< elements with a nonzero gradient
  double underflow = 0;         ///< fraction of the nonzero ones that flush to 0 in fp16 at the scale
  double overflow = 0;          ///< fraction of the nonzero ones that exceed 65504 (or are inf/NaN)
  double max_abs = 0;           ///< largest unscaled gradient magnitude
};

struct GradientHealth {
  double scale = 1;
  int64_t nonzero = 0;
  double underflow = 0;  ///< over all parameters, fraction of nonzero gradient elements
  double overflow = 0;
  std::vector<ParamGradHealth> params;  ///< worst underflow first
};

/// Measures the (unscaled) gradients currently held by `model`'s parameters as
/// fp16 would see them after multiplying by `scale`. Parameter gradients stand
/// in for the activation gradients fp16 carries through backward; they share
/// their magnitudes closely enough to show a flush-to-zero problem.
GradientHealth gradient_health(torch::nn::Module& model, double scale);

/// Computes fp32 gradients of `learn`'s model and loss on `batch` (no mixed
/// precision, no optimizer step) and measures them at `scale`. The model's
/// buffers and existing gradients are restored afterwards.
GradientHealth measure_gradients(Learner& learn, const data::Batch& batch, double scale);

/// The largest unscaled gradient magnitude measured (0 when none).
double largest_gradient(const GradientHealth& health);
/// The largest power of two that scales the largest measured gradient to below half
/// of fp16's max: how far the loss scale can go up. `fallback` when the gradients
/// give no measure (none measured, or themselves inf/NaN).
double roomy_scale(const GradientHealth& health, double fallback);

} // namespace mixtrain::diagnose
