#include "dispatch_mode.h"

#include "mixtrain/amp/fp16_emulation.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>

namespace mixtrain::amp::detail {

namespace {

thread_local int emulation_depth = 0;
thread_local int norms_depth = 0;
thread_local int trace_depth = 0;
thread_local OpObserver* observer = nullptr;
thread_local bool inside_traced_op = false;

int& depth(Mode mode) {
  switch (mode) {
    case Mode::kFp16Emulation: return emulation_depth;
    case Mode::kFp32Norms: return norms_depth;
    case Mode::kOpTrace: break;
  }
  return trace_depth;
}

bool runs_in_fp16_under_autocast(const std::string& name) {
  return autocast_list(name) == AutocastList::kLowerPrecision;
}

bool is_norm(const std::string& name) {
  return name == "aten::batch_norm" || name == "aten::layer_norm" || name == "aten::group_norm" ||
         name == "aten::instance_norm";
}

bool is_reduced(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() &&
         (v.toTensor().scalar_type() == at::kHalf || v.toTensor().scalar_type() == at::kBFloat16);
}

c10::IValue round_value(const c10::IValue& v) {
  if (v.isTensor()) return round_through_half(v.toTensor());
  if (v.isTensorList()) {
    std::vector<torch::Tensor> out;
    for (const auto& t : v.toTensorVector()) out.push_back(round_through_half(t));
    return out;
  }
  return v;
}

/// Runs `op` with the emulation / norm behaviours. When `raw_outputs` is given it
/// receives the outputs before emulation rounds them.
void run_op(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack,
            std::vector<c10::IValue>* raw_outputs) {
  const auto below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kModeKey);
  const std::string& name = op.schema().name();
  const auto n_args = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  const auto n_out = static_cast<std::ptrdiff_t>(op.schema().returns().size());

  // Only the functional overloads are autocast's: an out= overload (mutable schema)
  // runs as it is, writing the caller's tensor, as CUDA autocast leaves it alone.
  // One list look-up per op: this runs for every op while emulation is on.
  const AutocastList list =
      emulation_depth > 0 && !op.schema().is_mutable() ? autocast_list(name) : AutocastList::kNone;
  if (list == AutocastList::kLowerPrecision) {
    // Round inputs, run with the mode off inside (inner ops are not rounded again), round outputs.
    c10::impl::ExcludeDispatchKeyGuard off(kModeKey);
    for (auto it = stack->end() - n_args; it != stack->end(); ++it) *it = round_value(*it);
    op.redispatchBoxed(below, stack);
    if (raw_outputs) raw_outputs->assign(stack->end() - n_out, stack->end());
    for (auto it = stack->end() - n_out; it != stack->end(); ++it) *it = round_value(*it);
    return;
  }
  if (norms_depth > 0 && is_norm(name) && n_args > 0 && is_reduced(*(stack->end() - n_args))) {
    // A norm layer kept in fp32 receiving a half/bf16 input: normalize in fp32
    // (libtorch's CPU layer/group norm reject mixed dtypes), return the input's dtype.
    c10::impl::ExcludeDispatchKeyGuard off(kModeKey);
    auto& input = *(stack->end() - n_args);
    const auto dtype = input.toTensor().scalar_type();
    input = input.toTensor().to(at::kFloat);
    op.redispatchBoxed(below, stack);
    auto& out = *(stack->end() - n_out);
    if (out.isTensor()) out = out.toTensor().to(dtype);
  } else if (list == AutocastList::kFp32 || list == AutocastList::kPromote) {
    // Autocast runs these in fp32 (or the widest input dtype) with itself excluded
    // for their inner calls: a cdist's or tensordot's inner matmul is not fp16.
    c10::impl::ExcludeDispatchKeyGuard off(kModeKey);
    op.redispatchBoxed(below, stack);
  } else {
    op.redispatchBoxed(below, stack);  // the mode stays on for the op's inner calls
  }
  if (raw_outputs) raw_outputs->assign(stack->end() - n_out, stack->end());
}

void mode_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (trace_depth == 0 || observer == nullptr || inside_traced_op) {
    run_op(op, keys, stack, nullptr);
    return;
  }
  const auto n_args = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  const std::vector<c10::IValue> inputs(stack->end() - n_args, stack->end());  // refcounted handles
  std::vector<c10::IValue> outputs;
  inside_traced_op = true;
  try {
    run_op(op, keys, stack, &outputs);
  } catch (...) {
    inside_traced_op = false;
    throw;
  }
  inside_traced_op = false;
  c10::impl::ExcludeDispatchKeyGuard off(kModeKey);  // the observer's own ops are not traced
  const auto n_out = static_cast<std::ptrdiff_t>(op.schema().returns().size());
  const std::vector<c10::IValue> results(stack->end() - n_out, stack->end());
  observer->on_op(op.schema().name(), inputs, outputs, results, runs_in_fp16_under_autocast(op.schema().name()));
}

/// Registers mode_fallback on kModeKey, once per process, when first needed: the
/// key is otherwise left free, and linking the library changes nothing.
void register_fallback_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Lives for the process: the registration is undone when the Library is destroyed.
    static auto* library = new torch::Library(torch::Library::IMPL, "_", kModeKey, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&mode_fallback>());
  });
}

} // namespace

DispatchModeGuard::DispatchModeGuard(Mode mode) : mode_(mode), include_((register_fallback_once(), kModeKey)) {
  ++depth(mode);
}
DispatchModeGuard::~DispatchModeGuard() { --depth(mode_); }

OpObserver* set_op_observer(OpObserver* next) {
  OpObserver* previous = observer;
  observer = next;
  return previous;
}

bool mode_active(Mode mode) { return depth(mode) > 0 && c10::impl::tls_is_dispatch_key_included(kModeKey); }

} // namespace mixtrain::amp::detail

namespace mixtrain::amp {

OpTraceScope::OpTraceScope(OpObserver* observer)
    : previous_(detail::set_op_observer(observer)),
      mode_(std::make_shared<detail::DispatchModeGuard>(detail::Mode::kOpTrace)) {}

OpTraceScope::~OpTraceScope() {
  mode_.reset();
  detail::set_op_observer(previous_);
}

} // namespace mixtrain::amp
