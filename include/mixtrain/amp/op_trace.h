#pragma once
/// Op tracing: an observer that sees every top-level op a thread runs, with the
/// op's inputs, its outputs before fp16 emulation rounds them, and what it
/// returns; and which of CUDA autocast's op lists an op is on. The overflow
/// tracer (diagnose/overflow_trace.h) is built on it.

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <memory>
#include <string>

namespace mixtrain::amp {

/// CUDA autocast's op lists in torch 2.x (aten/src/ATen/autocast_mode.h:
/// AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE,
/// AT_FORALL_PROMOTE, and cat/stack/index_copy registered as promote in
/// autocast_mode.cpp). One list, used by the fp16 emulation and the tracer.
enum class AutocastList {
  kNone,            ///< not listed: runs in its inputs' dtype
  kLowerPrecision,  ///< runs in fp16 (conv, linear, matmul, addmm, bmm, RNN cells, ...)
  kFp32,            ///< runs in fp32 (softmax, layer_norm, exp/log/pow, the losses, sum/cumsum, norms, ...)
  kPromote,         ///< runs in the widest input dtype (cat, stack, addcmul, tensordot, ...)
};

/// The list `op_name` ("aten::addmm") is on.
AutocastList autocast_list(const std::string& op_name);

/// Whether `op_name` only casts or views its input (autocast's fp16 copy of a weight, a
/// transpose): an observer counts its result as the input's (its module's), not as an output.
bool is_cast_or_view(const std::string& op_name);

/// Calls `fn` on every defined tensor among an op's values: tensors, tensor
/// lists, and optional-tensor lists (Tensor?[], index's indices).
template <typename F>
void for_each_tensor(c10::ArrayRef<c10::IValue> values, F&& fn) {
  for (const auto& v : values) {
    if (v.isTensor()) {
      if (v.toTensor().defined()) fn(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec())
        if (t.defined()) fn(t);
    } else if (v.isList()) {
      for (const auto& e : v.toListRef())
        if (e.isTensor() && e.toTensor().defined()) fn(e.toTensor());
    }
  }
}

/// Sees every top-level op run on a thread inside an OpTraceScope (ops called
/// from inside an op are not reported again).
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  /// `outputs` are measured before fp16 emulation rounds them to half, so a value
  /// that rounds to inf still shows its real magnitude. `ran_reduced`: the op ran
  /// in fp16 (or bf16) and its results are fp16 tensors, as the emulation decided
  /// it (reduced_precision_emulation.h's rules) or, under real autocast, their dtype says.
  /// `results` are what the op returns to its caller (rounded, under emulation).
  virtual void on_op(const std::string& name, c10::ArrayRef<c10::IValue> inputs, c10::ArrayRef<c10::IValue> outputs,
                     c10::ArrayRef<c10::IValue> results, bool ran_reduced) = 0;
};

/// RAII: `observer` sees this thread's ops while the scope lives; the previous
/// observer (if any) is restored on every exit path.
class OpTraceScope {
 public:
  explicit OpTraceScope(OpObserver* observer);
  ~OpTraceScope();
  OpTraceScope(const OpTraceScope&) = delete;
  OpTraceScope& operator=(const OpTraceScope&) = delete;

 private:
  OpObserver* previous_;
  std::shared_ptr<void> mode_;
};

} // namespace mixtrain::amp
