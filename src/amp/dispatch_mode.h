#pragma once
// Private: the dispatcher mode behind fp16 emulation and master-weights norms.
//
// One boxed fallback on TESTING_ONLY_GenericMode serves both, since a key takes
// one fallback. Each behaviour has a thread-local depth; the key is included
// while any depth is positive.

#include "mixtrain/amp/op_trace.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string>

namespace mixtrain::amp::detail {

enum class Mode { kFp16Emulation, kFp32Norms, kOpTrace };

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

/// The key our fallback is registered on.
constexpr c10::DispatchKey kModeKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

} // namespace mixtrain::amp::detail
