#pragma once
// Private: the dispatcher mode behind fp16 emulation and master-weights norms.
//
// One boxed fallback on TESTING_ONLY_GenericMode serves both, since a key takes
// one fallback. Each behaviour has a thread-local depth; the key is included
// while any depth is positive.

#include "mixtrain/models/module_scope.h"
#include "mixtrain/amp/op_trace.h"

#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace mixtrain::amp::detail {

enum class Mode { kReducedPrecisionEmulation, kFp32Norms, kOpTrace, kFp32Islands };

/// Installs the fp32 islands' module patterns for this thread (nullptr removes
/// them); returns the previous ones. The emulation and master weights' fp32 mode read them.
const std::vector<std::string>* set_islands(const std::vector<std::string>* patterns);
/// The parameters of the islands' modules (by TensorImpl), for ops no scope names.
const std::unordered_set<const void*>* set_island_params(const std::unordered_set<const void*>* params);

/// Whether this thread's island ops return the bf16/fp16 dtype they were fed (keep_fp32 on a
/// model stored in that dtype) instead of fp32; returns the previous setting.
bool set_islands_cast_back(bool cast_back);

/// Installs the observer for this thread (nullptr removes it); returns the previous one.
OpObserver* set_op_observer(OpObserver* observer);

/// While alive, `mode` is on for this thread. Nestable. The first guard ever
/// made registers the dispatcher fallback (a process that never uses fp16
/// emulation, fp32 norms or the tracer never has it).
class DispatchModeGuard {
 public:
  explicit DispatchModeGuard(Mode mode);
  ~DispatchModeGuard();
  DispatchModeGuard(const DispatchModeGuard&) = delete;
  DispatchModeGuard& operator=(const DispatchModeGuard&) = delete;

 private:
  Mode mode_;
  c10::impl::IncludeDispatchKeyGuard include_;
};

bool mode_active(Mode mode);

// ---- fp16/bf16 emulation's helpers (reduced_precision_emulation.cpp).

/// A fresh float tensor holding `x` rounded through `dtype` (no autograd).
at::Tensor rounded_copy(const at::Tensor& x, c10::ScalarType dtype);
/// Rounds a float tensor's values through `dtype` in place, unseen by autograd
/// (no version bump): for an op's fresh output, before anyone reads it.
void round_in_place(const at::Tensor& t, c10::ScalarType dtype);
/// Records that `t` holds a reduced-precision result; is_marked asks.
void mark_reduced(const at::Tensor& t);
bool is_marked(const at::Tensor& t);
/// The dtype the thread's emulation rounds through (Undefined when off).
c10::ScalarType emulated_dtype();

/// The key our fallback is registered on (core's name for it: module_scope.h).
constexpr c10::DispatchKey kModeKey = mixtrain::detail::kOpModeKey;

} // namespace mixtrain::amp::detail
