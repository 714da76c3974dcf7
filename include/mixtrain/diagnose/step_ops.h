#pragma once
/// What one training step dispatches: the top-level ATen ops and the CPU allocations of
/// a Learner's step, whole (forward, loss, backward, the scaler, the optimizer and every
/// callback). On a GPU each op is a launch at least, so the count is the step's overhead
/// in a number that does not depend on the machine's noise. bench/step_ops.cpp sets it
/// beside a Python loop's (bench/python_step_ops.py), and a test holds the CNN's to its
/// recorded figure.

#include <cstdint>
#include <map>
#include <string>

namespace mixtrain {
class Learner;
}

namespace mixtrain::diagnose {

/// One training step's dispatches.
struct StepOps {
  /// Top-level ops, counted at the dispatcher by the op tracer's mode (amp/op_trace.h):
  /// an op's own inner calls are not counted again, and autocast's casts are ops of their
  /// own. Python's TorchDispatchMode counts the same step a little differently: it sees
  /// a composite op (aten::conv2d) as what it decomposes into (aten::convolution).
  int64_t ops = 0;
  /// Each op's count, by name ("aten::addmm").
  std::map<std::string, int64_t> by_op;
  /// Allocations from c10's CPU allocator, and their bytes (the hook torch's profiler
  /// reads with profile_memory=True). CUDA allocations are not counted.
  int64_t allocations = 0;
  int64_t allocated_bytes = 0;
  /// The bytes of the step's CPU allocations still held when it ends (after its last
  /// callback): what the Learner keeps of a step until the next one (the batch, the
  /// prediction and the loss). An activation, a cast cache or a graph kept past the step
  /// shows here.
  int64_t kept_bytes = 0;
  /// "aten::add_ 18, aten::mm 2, ...": the counts, largest first, for a message.
  std::string str() const;
};

/// Fits `learn` for one epoch at `lr` and counts its training step `step` (0-based;
/// counting a step after the first leaves out the optimizer's first allocation of its
/// state), then stops the fit after that step. The loader must have more than `step`
/// training batches: std::invalid_argument if it has not, and std::runtime_error if the
/// fit stops before the step ends (another callback stopped it).
StepOps count_step_ops(Learner& learn, int64_t step, double lr = 1e-3);

} // namespace mixtrain::diagnose
