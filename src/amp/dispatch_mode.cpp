#include "dispatch_mode.h"

#include "mixtrain/amp/reduced_precision_emulation.h"
#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/amp/op_trace.h"
#include "mixtrain/util/option_error.h"
#include "mixtrain/models/module_scope.h"

#include "util/comma_list.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/nn/module.h>
#include <torch/library.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace mixtrain::amp::detail {

namespace {

thread_local int emulation_depth = 0;
thread_local int norms_depth = 0;
thread_local int trace_depth = 0;
thread_local int islands_depth = 0;
thread_local OpObserver* observer = nullptr;
thread_local bool inside_traced_op = false;
thread_local const std::vector<std::string>* islands = nullptr;  // fp32 islands' module patterns

thread_local const std::unordered_set<const void*>* island_params = nullptr;
// keep_fp32 on a model stored in bf16/fp16: an island's op returns the dtype it was fed.
thread_local bool islands_cast_back = false;

/// Whether the running op (its `n_args` arguments on top of `stack`) belongs to a
/// module kept in fp32: by the module boundary, or by taking one of its parameters.
bool in_island(const torch::jit::Stack* stack, std::ptrdiff_t n_args) {
  if (islands == nullptr || islands->empty()) return false;
  if (island_params && !island_params->empty())
    for (auto it = stack->end() - n_args; it != stack->end(); ++it) {
      if (!it->isTensor() || !it->toTensor().defined()) continue;
      const at::Tensor& t = it->toTensor();
      // A weight often arrives as a view (linear's weight.t()): its base is the parameter.
      if (island_params->count(t.unsafeGetTensorImpl()) || (t.is_view() && island_params->count(t._base().unsafeGetTensorImpl())))
        return true;
    }
  const std::string path = current_module_path();
  for (const auto& pattern : *islands)
    if (module_path_matches(pattern, path)) return true;
  return false;
}

int& depth(Mode mode) {
  switch (mode) {
    case Mode::kReducedPrecisionEmulation: return emulation_depth;
    case Mode::kFp32Norms: return norms_depth;
    case Mode::kOpTrace: break;
    case Mode::kFp32Islands: return islands_depth;
  }
  return trace_depth;
}

bool is_norm(const std::string& name) {
  return name == "aten::batch_norm" || name == "aten::layer_norm" || name == "aten::group_norm" ||
         name == "aten::instance_norm";
}

bool is_reduced(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() &&
         (v.toTensor().scalar_type() == at::kHalf || v.toTensor().scalar_type() == at::kBFloat16);
}

/// What the emulation needs to know about an op, worked out once per operator.
struct OpInfo {
  AutocastList list = AutocastList::kNone;
  bool in_place = false;             ///< writes its first argument and returns it (add_, relu_, copy_)
  bool other_mutation = false;       ///< out= overloads, ops that update other arguments (running stats)
  bool value_preserving = false;     ///< views, copies, relu, max-pooling: outputs hold input values
  bool follows_first_input = false;  ///< batch/instance norm: the output has the input's dtype
  bool is_cast = false;              ///< aten::to / _to_copy: an explicit dtype decides
  int dtype_arg = -1;                ///< the cast's dtype argument
};

/// Ops whose outputs hold values of their inputs (besides views): rounding them
/// again would change nothing, so it is skipped. Their backward only moves or
/// sums gradients, which the producer of their input rounds.
bool preserves_values(const std::string& name) {
  static const std::unordered_set<std::string> kOps = {
      "aten::clone", "aten::contiguous", "aten::reshape", "aten::flatten", "aten::relu", "aten::cat", "aten::stack",
      "aten::index_select", "aten::gather", "aten::index", "aten::max_pool1d", "aten::max_pool2d",
      "aten::max_pool3d", "aten::max_pool2d_with_indices", "aten::adaptive_max_pool2d", "aten::neg", "aten::abs",
      "aten::repeat", "aten::max", "aten::min", "aten::amax", "aten::amin", "aten::sort", "aten::topk",
      "aten::flip", "aten::roll", "aten::zeros_like", "aten::ones_like", "aten::narrow_copy", "aten::_unsafe_view"};
  return kOps.count(name) > 0;
}

const OpInfo& info_of(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const c10::FunctionSchema*, OpInfo> cache;
  const c10::FunctionSchema& schema = op.schema();
  const auto found = cache.find(&schema);
  if (found != cache.end()) return found->second;
  OpInfo info;
  const std::string& name = schema.name();
  const auto& args = schema.arguments();
  const bool writes_first = !args.empty() && args[0].alias_info() && args[0].alias_info()->isWrite();
  info.in_place = writes_first && schema.overload_name() != "out" && !name.empty() && name.back() == '_';
  info.other_mutation = schema.is_mutable() && !info.in_place;
  // Only the functional overloads are autocast's: an out= overload runs as it is.
  info.list = schema.is_mutable() ? AutocastList::kNone : autocast_list(name);
  const auto& rets = schema.returns();
  const bool view = !rets.empty() && rets[0].alias_info() && !rets[0].alias_info()->isWrite();
  info.value_preserving = view || preserves_values(name);
  info.follows_first_input = name == "aten::batch_norm" || name == "aten::instance_norm";
  info.is_cast = name == "aten::to" || name == "aten::_to_copy";
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].name() == "dtype") info.dtype_arg = static_cast<int>(i);
  return cache.emplace(&schema, info).first->second;
}

/// Whether an unlisted (or promote-list) op's result is a reduced-precision
/// tensor on a GPU: torch's type promotion over its floating inputs, where
/// tensors with dimensions decide and 0-dim ones count only without them.
bool result_is_reduced(const OpInfo& info, c10::ArrayRef<c10::IValue> args) {
  if (info.follows_first_input) return !args.empty() && args[0].isTensor() && is_marked(args[0].toTensor());
  bool dims_seen = false, dims_reduced = true, scalars_seen = false, scalars_reduced = true;
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (!t.is_floating_point()) return;
    const bool r = is_marked(t);
    if (t.dim() > 0) {
      dims_seen = true;
      dims_reduced = dims_reduced && r;
    } else {
      scalars_seen = true;
      scalars_reduced = scalars_reduced && r;
    }
  });
  return dims_seen ? dims_reduced : scalars_seen && scalars_reduced;
}

/// Copies of `values`' float tensors: what the tracer measures before rounding.
std::vector<c10::IValue> snapshot(c10::ArrayRef<c10::IValue> values) {
  std::vector<c10::IValue> out;
  for (const auto& v : values) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() == at::kFloat)
      out.emplace_back(v.toTensor().clone());
    else
      out.push_back(v);
  }
  return out;
}

/// Rounds a reduced-precision result in place, and the gradient that reaches it
/// on the way back (autograd makes half gradients for half tensors).
void round_result(const at::Tensor& t, c10::ScalarType dtype) {
  round_in_place(t, dtype);
  if (t.requires_grad() && at::GradMode::is_enabled())
    t.register_hook([dtype](const at::Tensor& g) { return rounded_copy(g, dtype); });
}

/// The outputs of an op that ran in the reduced precision: rounded (unless they
/// already hold reduced values) and marked, so ops that use them know.
void finish_reduced(c10::ArrayRef<c10::IValue> outputs, bool round, c10::ScalarType dtype) {
  for_each_tensor(outputs, [&](const at::Tensor& t) {
    if (t.scalar_type() != at::kFloat) return;
    if (round) round_result(t, dtype);
    mark_reduced(t);
  });
}

/// Runs `op` the way the thread's emulation says. Returns whether its results
/// are reduced-precision tensors. `raw_outputs`, when given, receives the
/// outputs before rounding.
bool emulate_op(const c10::OperatorHandle& op, c10::DispatchKeySet below, torch::jit::Stack* stack,
                std::vector<c10::IValue>* raw_outputs) {
  const OpInfo& info = info_of(op);
  const auto n_args = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  const auto n_out = static_cast<std::ptrdiff_t>(op.schema().returns().size());
  const c10::ScalarType dtype = emulated_dtype();
  const auto outputs = [&] { return c10::ArrayRef<c10::IValue>(&*(stack->end() - n_out), n_out); };
  const auto keep_raw = [&](bool rounding) {
    if (raw_outputs) *raw_outputs = rounding ? snapshot(outputs()) : std::vector<c10::IValue>(outputs().begin(), outputs().end());
  };
  if (info.other_mutation) {  // out= overloads: the caller's tensor, unrounded
    op.redispatchBoxed(below, stack);
    keep_raw(false);
    return false;
  }
  const c10::ArrayRef<c10::IValue> args(&*(stack->end() - n_args), n_args);
  // Reduced and fp32-list ops: their inner calls are not rounded (as autocast excludes itself).
  c10::optional<c10::impl::ExcludeDispatchKeyGuard> off;
  off.emplace(kModeKey);

  if (info.in_place) {
    // x += y keeps x's dtype: an fp16 result stays one and is rounded again.
    const at::Tensor self = args[0].isTensor() ? args[0].toTensor() : at::Tensor();
    const bool reduced = self.defined() && is_marked(self);
    op.redispatchBoxed(below, stack);
    keep_raw(reduced && !info.value_preserving);
    if (reduced && !info.value_preserving) round_result(self, dtype);
    return reduced;
  }

  if (info.is_cast && n_args > 0 && args[0].isTensor() && args[0].toTensor().scalar_type() == at::kFloat) {
    // x.to(kHalf) inside emulation gives an emulated half (fp32 storage, rounded);
    // x.float() leaves fp16: a fresh alias that is not marked.
    const bool in_reduced = is_marked(args[0].toTensor());
    c10::optional<c10::ScalarType> target;
    if (info.dtype_arg >= 0) {
      c10::IValue& dtype_value = stack->at(stack->size() - n_args + info.dtype_arg);
      if (!dtype_value.isNone()) target = static_cast<c10::ScalarType>(dtype_value.toInt());
      if (target == dtype) dtype_value = c10::IValue(static_cast<int64_t>(at::kFloat));
    }
    const at::Tensor input = args[0].toTensor();
    op.redispatchBoxed(below, stack);
    keep_raw(false);
    auto& out = *(stack->end() - 1);
    const bool to_reduced = target == dtype || (!target && in_reduced);
    if (to_reduced) {
      if (!in_reduced) out = c10::IValue(round_through(out.toTensor(), dtype));
      mark_reduced(out.toTensor());
    } else if (in_reduced && out.isTensor() && out.toTensor().unsafeGetTensorImpl() == input.unsafeGetTensorImpl()) {
      out = c10::IValue(input.alias());  // the fp32 copy must not share the fp16 result's identity
    }
    return to_reduced;
  }

  switch (info.list) {
    case AutocastList::kLowerPrecision: {
      // Autocast's fp16 list: fp32 inputs (weights, fp32 activations) are cast,
      // fp16 results go in as they are; computed in fp32, the result rounded.
      for (auto it = stack->end() - n_args; it != stack->end(); ++it) {
        if (it->isTensor()) {
          const at::Tensor& t = it->toTensor();
          if (t.defined() && t.scalar_type() == at::kFloat && !is_marked(t)) *it = round_through(t, dtype);
        } else if (it->isTensorList()) {
          std::vector<at::Tensor> ts = it->toTensorVector();
          for (auto& t : ts)
            if (t.defined() && t.scalar_type() == at::kFloat && !is_marked(t)) t = round_through(t, dtype);
          *it = ts;
        }
      }
      op.redispatchBoxed(below, stack);
      keep_raw(true);
      finish_reduced(outputs(), /*round=*/true, dtype);
      return true;
    }
    case AutocastList::kFp32:
      op.redispatchBoxed(below, stack);  // fp32 on the (half) values; the result stays fp32
      keep_raw(false);
      return false;
    case AutocastList::kPromote:
    case AutocastList::kNone:
      break;
  }
  if (!result_is_reduced(info, args)) {
    // An unlisted fp32 op: the mode stays on for its inner calls (a composite may call a listed op).
    if (info.list == AutocastList::kNone) off.reset();
    op.redispatchBoxed(below, stack);
    keep_raw(false);
    return false;
  }
  op.redispatchBoxed(below, stack);
  keep_raw(!info.value_preserving);
  finish_reduced(outputs(), /*round=*/!info.value_preserving, dtype);
  return true;
}

/// Runs `op` with the emulation / norm behaviours. When `raw_outputs` is given it
/// receives the outputs before emulation rounds them. Returns whether the op's
/// results are fp16/bf16 (emulated or real).
bool run_op(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack,
            std::vector<c10::IValue>* raw_outputs) {
  const auto below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kModeKey);
  const std::string& name = op.schema().name();
  const auto n_args = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  const auto n_out = static_cast<std::ptrdiff_t>(op.schema().returns().size());

  if (norms_depth > 0 && n_args > 0) {
    // Master weights keep norm layers and fp32 islands in fp32 while the rest of
    // the model is half/bf16: such an op computes in fp32 on its half/bf16 inputs
    // (libtorch's CPU ops reject mixed dtypes) and returns the model's dtype.
    const bool norm = is_norm(name) && is_reduced(*(stack->end() - n_args));
    std::optional<at::ScalarType> reduced;
    if (!norm && in_island(stack, n_args))
      for (auto it = stack->end() - n_args; it != stack->end() && !reduced; ++it)
        if (is_reduced(*it)) reduced = it->toTensor().scalar_type();
    if (norm || reduced) {
      c10::impl::ExcludeDispatchKeyGuard off(kModeKey);
      const auto dtype = norm ? (stack->end() - n_args)->toTensor().scalar_type() : *reduced;
      for (auto it = stack->end() - n_args; it != stack->end(); ++it)
        if (is_reduced(*it) && (!norm || it == stack->end() - n_args)) *it = it->toTensor().to(at::kFloat);
      op.redispatchBoxed(below, stack);
      for (auto it = stack->end() - n_out; it != stack->end(); ++it)
        if (it->isTensor() && it->toTensor().defined() && it->toTensor().scalar_type() == at::kFloat)
          *it = it->toTensor().to(dtype);
      if (raw_outputs) raw_outputs->assign(stack->end() - n_out, stack->end());
      return true;
    }
  }
  if (emulation_depth > 0 && in_island(stack, n_args)) {
    // An fp32 island under emulated autocast: the op runs in fp32 on its inputs as
    // they are (an fp16 result is its fp32 value), and its result is fp32: the ops
    // after the island see an fp32 tensor, and the usual promotion applies there.
    op.redispatchBoxed(below, stack);
    if (raw_outputs) raw_outputs->assign(stack->end() - n_out, stack->end());
    return false;
  }
  if (emulation_depth > 0) return emulate_op(op, below, stack, raw_outputs);
  if (islands_depth > 0 && in_island(stack, n_args)) {
    // An fp32 island under real autocast (CUDA, or the CPU's): our key sits above the
    // Autocast keys, so the op can skip them: its half/bf16 inputs are cast to fp32
    // and it computes in fp32; the ops after the island see fp32 results.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKeySet({c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA}));
    std::optional<at::ScalarType> fed;  // the first bf16/fp16 input's dtype
    {
      // The casts themselves must not come back here: inside the island, aten::to on
      // a bf16 input is an island op with a bf16 input, which would cast it again,
      // endlessly (a stack overflow under real CPU bf16).
      c10::impl::ExcludeDispatchKeyGuard no_mode(kModeKey);
      for (auto it = stack->end() - n_args; it != stack->end(); ++it) {
        if (is_reduced(*it)) {
          if (!fed) fed = it->toTensor().scalar_type();
          *it = it->toTensor().to(at::kFloat);
        } else if (it->isTensorList()) {
          std::vector<at::Tensor> ts = it->toTensorVector();
          for (auto& t : ts)
            if (t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16)) t = t.to(at::kFloat);
          *it = ts;
        }
      }
    }
    const auto no_autocast_keys = below.remove(c10::DispatchKey::AutocastCPU).remove(c10::DispatchKey::AutocastCUDA);
    op.redispatchBoxed(no_autocast_keys, stack);
    if (islands_cast_back && fed) {
      // A model stored in bf16/fp16 around the island: the next op takes its weights in
      // that dtype and refuses an fp32 input (no autocast promotes), so the island's
      // result goes back to the dtype it came in with.
      c10::impl::ExcludeDispatchKeyGuard no_mode(kModeKey);
      for (auto it = stack->end() - n_out; it != stack->end(); ++it)
        if (it->isTensor() && it->toTensor().defined() && it->toTensor().scalar_type() == at::kFloat)
          *it = it->toTensor().to(*fed);
    }
    if (raw_outputs) raw_outputs->assign(stack->end() - n_out, stack->end());
    return islands_cast_back && fed.has_value();
  }
  op.redispatchBoxed(below, stack);  // the mode stays on for the op's inner calls
  if (raw_outputs) raw_outputs->assign(stack->end() - n_out, stack->end());
  // Under real autocast (a GPU), the result's dtype says it.
  bool reduced = false;
  for_each_tensor(c10::ArrayRef<c10::IValue>(&*(stack->end() - n_out), n_out), [&](const at::Tensor& t) {
    reduced = reduced || t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
  });
  return reduced;
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
  bool reduced = false;
  try {
    reduced = run_op(op, keys, stack, &outputs);
  } catch (...) {
    inside_traced_op = false;
    throw;
  }
  inside_traced_op = false;
  c10::impl::ExcludeDispatchKeyGuard off(kModeKey);  // the observer's own ops are not traced
  const auto n_out = static_cast<std::ptrdiff_t>(op.schema().returns().size());
  const std::vector<c10::IValue> results(stack->end() - n_out, stack->end());
  observer->on_op(op.schema().name(), inputs, outputs, results, reduced);
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

const std::unordered_set<const void*>* set_island_params(const std::unordered_set<const void*>* params) {
  const std::unordered_set<const void*>* previous = island_params;
  island_params = params;
  return previous;
}

bool set_islands_cast_back(bool cast_back) {
  const bool previous = islands_cast_back;
  islands_cast_back = cast_back;
  return previous;
}

const std::vector<std::string>* set_islands(const std::vector<std::string>* patterns) {
  const std::vector<std::string>* previous = islands;
  islands = patterns;
  return previous;
}

OpObserver* set_op_observer(OpObserver* next) {
  OpObserver* previous = observer;
  observer = next;
  return previous;
}

bool mode_active(Mode mode) { return depth(mode) > 0 && c10::impl::tls_is_dispatch_key_included(kModeKey); }

} // namespace mixtrain::amp::detail
