#include "mixtrain/diagnose/step_ops.h"

#include "mixtrain/amp/op_trace.h"
#include "mixtrain/core/callback.h"
#include "mixtrain/core/learner.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mixtrain::diagnose {

namespace {

/// Counts this thread's top-level ops and CPU allocations while `counting`.
class Counter : public amp::OpObserver, public c10::MemoryReportingInfoBase {
 public:
  void on_op(const std::string& name, c10::ArrayRef<c10::IValue>, c10::ArrayRef<c10::IValue>,
             c10::ArrayRef<c10::IValue>, bool) override {
    if (counting) ++counts.by_op[name];
  }
  void reportMemoryUsage(void* ptr, int64_t bytes, size_t, size_t, c10::Device device) override {
    // Frees report negative sizes; CUDA's caching allocator reports here too.
    if (!device.is_cpu()) return;
    if (counting && bytes > 0) {
      ++counts.allocations;
      counts.allocated_bytes += bytes;
      live[ptr] = bytes;
    } else if (bytes < 0) {
      live.erase(ptr);  // freed, in the step or after it
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
  bool counting = false;
  bool counted = false;
  StepOps counts;
  std::unordered_map<void*, int64_t> live;  // the step's allocations not yet freed
};

/// Opens the count before every other callback's before_batch of the step (order
/// -1000), or closes it after every other callback's after_batch and stops the fit
/// (order 1000).
class CountStep : public Callback {
 public:
  CountStep(Counter* counter, int64_t step, bool opens) : counter_(counter), step_(step), opens_(opens) {
    order = opens ? -1000 : 1000;
  }
  void before_batch(Learner& learn) override {
    if (opens_ && learn.training() && learn.train_iter() == step_) counter_->counting = true;
  }
  void after_batch(Learner&) override {
    if (opens_ || !counter_->counting) return;
    counter_->counting = false;
    counter_->counted = true;
    for (const auto& [ptr, bytes] : counter_->live) counter_->counts.kept_bytes += bytes;
    throw CancelFitException();
  }

 private:
  Counter* counter_;
  int64_t step_;
  bool opens_;
};

} // namespace

std::string StepOps::str() const {
  std::vector<std::pair<std::string, int64_t>> sorted(by_op.begin(), by_op.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (const auto& [name, n] : sorted) out += (out.empty() ? "" : ", ") + name + " " + std::to_string(n);
  return out;
}

StepOps count_step_ops(Learner& learn, int64_t step, double lr) {
  const int64_t batches = learn.dls().train.num_batches();
  if (step < 0 || step >= batches)
    throw std::invalid_argument("count_step_ops: step " + std::to_string(step) + " is not one of the " +
                                std::to_string(batches) + " training batches of an epoch");
  // The allocator reports to the thread's profiler state; Counter stands in for the profiler.
  auto counter = std::make_shared<Counter>();
  {
    const c10::DebugInfoGuard report(c10::DebugInfoKind::PROFILER_STATE, counter);
    const amp::OpTraceScope observe(counter.get());
    learn.fit(1, lr, {std::make_shared<CountStep>(counter.get(), step, true),
                      std::make_shared<CountStep>(counter.get(), step, false)});
  }
  // Another callback may stop the fit first (an early stop, a NaN): no count is not zero ops.
  if (!counter->counted)
    throw std::runtime_error("count_step_ops: the fit stopped before training step " + std::to_string(step) +
                             " ended, so it was not counted");
  StepOps out = std::move(counter->counts);
  for (const auto& [name, n] : out.by_op) out.ops += n;
  return out;
}

} // namespace mixtrain::diagnose
