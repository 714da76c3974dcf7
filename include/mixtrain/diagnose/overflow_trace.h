#pragma once
/// Overflow tracer: which op's fp16 output overflows, and in which module.

#include "mixtrain/data/data.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain {
class Learner;
}

namespace mixtrain::diagnose {

/// Largest finite fp16 value.
constexpr double kFp16Max = 65504.0;
/// Outputs above this (2^14, a quarter of fp16's range) are reported as at risk.
constexpr double kAtRiskMagnitude = 16384.0;

/// One op of a traced forward pass.
struct OpFinding {
  int64_t index = 0;         ///< position among the traced ops, in execution order
  std::string op;            ///< e.g. "aten::linear"
  std::string module;        ///< path of the module whose parameter the op used ("body.2.fc1"), or ""
  std::string after_module;  ///< for ops without a parameter: the last module seen before it
  double max_abs = 0;        ///< largest finite magnitude among its outputs (before rounding to half)
  int64_t nonfinite = 0;     ///< inf/NaN elements among its outputs
  bool fp16 = false;         ///< whether it runs in fp16 under autocast
  std::string scope;         ///< the module the op runs in (its module boundary, mixtrain/module_scope.h), or ""
  /// "body.2.fc1 (aten::linear)", "aten::matmul in encoder.layers.0.self_attention"
  /// (an op without a parameter, inside a module), or "aten::add after body.2.fc1".
  std::string where() const;
  /// The module to keep in fp32 against it: the parameter's owner, else the module it runs in ("" at the top level).
  std::string island() const { return !module.empty() ? module : scope; }
};

struct OverflowTrace {
  int64_t ops_traced = 0;
  /// The first op running in fp16 whose output exceeds 65504 or turns finite
  /// inputs into inf/NaN: where the forward pass overflows.
  std::optional<OpFinding> first_overflow;
  /// Ops running in fp16 whose outputs stay finite but exceed 2^14, largest first.
  std::vector<OpFinding> at_risk;
  /// The first fp32 op that turns finite inputs into inf/NaN (not an fp16 problem).
  std::optional<OpFinding> first_fp32_nonfinite;
  /// The batch's inputs already held inf/NaN (nothing downstream is to blame).
  bool input_nonfinite = false;
  /// The loss of the traced pass.
  double loss = 0;
};

/// Runs one forward pass and loss of `learn`'s model on `batch` with fp16
/// numerics (emulated on CPU, CUDA autocast on a GPU) and every op observed.
/// Which ops run in fp16 is the emulation's decision (amp/reduced_precision_emulation.h: the
/// fp16 list, and unlisted ops whose inputs are all fp16 results), or on a GPU
/// the dtype autocast gives their results: one source of truth. The model is in
/// training mode; its buffers (BatchNorm statistics) are restored afterwards and
/// no gradient is kept.
///
/// Module paths come from parameter identity: an op that reads a parameter (or
/// autocast's fp16 copy of one) is attributed to the module owning it.
OverflowTrace trace_overflow(Learner& learn, const data::Batch& batch);

} // namespace mixtrain::diagnose
