// The op tracer's scope (mixtrain/amp/op_trace.h): installs an observer on the dispatcher
// mode (dispatch_mode.cpp calls it for every op while the scope lives).
#include "mixtrain/amp/op_trace.h"

#include "dispatch_mode.h"

#include <memory>

namespace mixtrain::amp {

bool is_cast_or_view(const std::string& name) {
  // TorchScript's autocast casts with its own two ops, and its profiling executor detaches
  // the parameters it reads.
  return name == "aten::to" || name == "aten::_to_copy" || name == "aten::t" || name == "aten::view" ||
         name == "aten::reshape" || name == "aten::contiguous" || name == "aten::transpose" ||
         name == "aten::_autocast_to_reduced_precision" || name == "aten::_autocast_to_full_precision" ||
         name == "aten::detach" || name == "aten::alias";
}

OpTraceScope::OpTraceScope(OpObserver* observer)
    : previous_(detail::set_op_observer(observer)),
      mode_(std::make_shared<detail::DispatchModeGuard>(detail::Mode::kOpTrace)) {}

OpTraceScope::~OpTraceScope() {
  mode_.reset();
  detail::set_op_observer(previous_);
}

} // namespace mixtrain::amp
