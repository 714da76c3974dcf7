// Where one training step of a Learner goes: its time split into phases, and what it
// dispatches (diagnose::count_step_ops: the top-level ATen ops, counted at the
// dispatcher below autograd as Python's TorchDispatchMode counts them, and the CPU
// allocations), for the built-in models and TorchScript files. Its peer in Python is
// bench/python_step_ops.py; BENCHMARKS.md puts them side by side.
//
//   step_ops MODEL BATCH [PRECISION] [torch|core] [--steps N] [--names]
// MODEL: cnn | resnet | transformer | a TorchScript file taking [N, 1, 28, 28] images.
// Prints one JSON line: a step's time split into phases (the mean of STEPS steps after
// 3 warm-up ones, nothing observing them), then the ops and allocations of one more
// step (optimizer state exists by then), and with --names each op's count.
#include "bench_learner.h"

#include <mixtrain/mixtrain.h>

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace {

/// The phases of a training step, by the Learner's events: data (after_batch to the
/// next before_batch: the loader and the loop), forward (to after_pred), loss (to
/// after_loss), backward (to after_backward: the scaler's unscale and checks included),
/// optimizer (to after_step) and callbacks (to after_batch).
struct StepSplit {
  static constexpr const char* kPhases[] = {"data", "forward", "loss", "backward", "optimizer", "callbacks"};
  std::array<double, 6> ms{};
  int64_t steps = 0;
  bool timing = false;  // the running batch is timed
  std::chrono::steady_clock::time_point last;
  void mark(int phase) {
    const auto now = std::chrono::steady_clock::now();
    if (phase >= 0) ms[phase] += std::chrono::duration<double, std::milli>(now - last).count();
    last = now;
  }
};

/// Marks the phases of the training steps from `from` on: one instance before every
/// other callback (first), one after them.
class SplitSteps : public mixtrain::Callback {
 public:
  SplitSteps(StepSplit* split, int64_t from, bool first) : split_(split), from_(from), first_(first) {
    order = first ? -1000 : 1000;
  }
  void before_batch(mixtrain::Learner& learn) override {
    if (!first_) return;
    const bool was_timing = split_->timing;
    split_->timing = learn.training() && learn.train_iter() >= from_;
    if (split_->timing) split_->mark(was_timing ? 0 : -1);  // data: since the last timed step
  }
  void after_pred(mixtrain::Learner&) override { if (first_ && split_->timing) split_->mark(1); }
  void after_loss(mixtrain::Learner&) override { if (first_ && split_->timing) split_->mark(2); }
  void after_backward(mixtrain::Learner&) override { if (!first_ && split_->timing) split_->mark(3); }
  void after_step(mixtrain::Learner&) override { if (!first_ && split_->timing) split_->mark(4); }
  void after_batch(mixtrain::Learner&) override {
    if (first_ || !split_->timing) return;
    split_->mark(5);
    ++split_->steps;
  }

 private:
  StepSplit* split_;
  int64_t from_;
  bool first_;
};

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL BATCH [PRECISION] [torch|core] [--steps N] [--names]\n", argv[0]);
    return 2;
  }
  return bench::run_guarded(argv[0], [&] {
    const std::string name = argv[1];
    const int64_t bs = std::atoll(argv[2]);
    const std::string precision = argc > 3 ? argv[3] : "fp32";
    bool core = false, list_names = false;
    int64_t timed_steps = 20;
    for (int i = 4; i < argc; ++i) {
      const std::string a = argv[i];
      core = core || a == "core";
      list_names = list_names || a == "--names";
      if (a == "--steps" && i + 1 < argc) timed_steps = std::atoll(argv[++i]);
    }
    const int64_t warmup = 3;
    const auto learn = bench::step_bench_learner(name, warmup + timed_steps, bs, precision, core);

    // The first fit times the steps after the warm-up ones, with nothing observing them.
    StepSplit split;
    learn->fit(1, 1e-3, {std::make_shared<SplitSteps>(&split, warmup, true), std::make_shared<SplitSteps>(&split, warmup, false)});
    // Then one more step is counted (optimizer state exists by now), and the fit stops after it.
    const mixtrain::diagnose::StepOps ops = mixtrain::diagnose::count_step_ops(*learn, 1);
    std::string per_op, phases;
    for (const auto& [op, count] : ops.by_op)
      if (list_names) per_op += (per_op.empty() ? "" : ", ") + std::string("\"") + op + "\": " + std::to_string(count);
    double step_ms = 0;
    for (size_t i = 0; i < split.ms.size(); ++i) {
      const double ms = split.ms[i] / static_cast<double>(std::max<int64_t>(split.steps, 1));
      step_ms += ms;
      phases += (i ? ", " : "") + std::string("\"") + StepSplit::kPhases[i] + "\": " + std::to_string(ms);
    }
    std::printf("{\"model\": \"%s\", \"precision\": \"%s\", \"loop\": \"mixtrain\", \"optimizer\": \"%s\", \"ops\": %lld, "
                "\"allocations\": %lld, \"allocated_mb\": %.1f, \"step_ms\": %.3f, \"phases_ms\": {%s}%s%s%s}\n",
                name.c_str(), precision.c_str(), core ? "core" : "torch", static_cast<long long>(ops.ops),
                static_cast<long long>(ops.allocations), ops.allocated_bytes / 1e6, step_ms, phases.c_str(),
                list_names ? ", \"names\": {" : "", per_op.c_str(), list_names ? "}" : "");
    return 0;
  });
}
