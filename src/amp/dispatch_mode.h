#pragma once
// Private: the dispatcher mode behind fp16 emulation and master-weights norms.
//
// One boxed fallback on TESTING_ONLY_GenericMode serves both, since a key takes
// one fallback. Each behaviour has a thread-local depth; the key is included
// while any depth is positive.

#include <ATen/core/ivalue.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/ArrayRef.h>

#include <string>

namespace mixtrain::amp::detail {

enum class Mode { kFp16Emulation, kFp32Norms, kOpTrace };

/// Sees every top-level op run on this thread while Mode::kOpTrace is on
/// (ops called from inside an op are not reported again).
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  /// `outputs` are measured before fp16 emulation rounds them to half, so a value
  /// that rounds to inf still shows its real magnitude. `in_fp16_list`: the op is
  /// on autocast's fp16 list (it runs in fp16 under CUDA autocast).
  /// `results` are what the op returns to its caller (rounded, under emulation).
  virtual void on_op(const std::string& name, c10::ArrayRef<c10::IValue> inputs, c10::ArrayRef<c10::IValue> outputs,
                     c10::ArrayRef<c10::IValue> results, bool in_fp16_list) = 0;
};

/// Installs the observer for this thread (nullptr removes it); returns the previous one.
OpObserver* set_op_observer(OpObserver* observer);

/// While alive, `mode` is on for this thread. Nestable.
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

/// The key our fallback is registered on.
constexpr c10::DispatchKey kModeKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

} // namespace mixtrain::amp::detail
