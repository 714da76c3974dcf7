// Where one training step of a Learner goes: its time split into phases, and what it
// dispatches (diagnose::count_step_ops: the top-level ATen ops, counted at the
// dispatcher below autograd as Python's TorchDispatchMode counts them, and the CPU
// allocations), for the built-in models and TorchScript files. Its peer in Python is
// bench/python_step_ops.py; BENCHMARKS.md puts them side by side.
//
//   step_ops MODEL BATCH [PRECISION] [torch|core] [--steps N] [--names] [--image CxHxW] [--matmul]
//            [--threads N] [--time-only]
// MODEL: cnn | mlp | resnet | transformer | transformer:LxD (bench_learner.h) | a TorchScript
// file taking [N, 1, 28, 28] images, or [N, C, H, W] with --image.
// Prints one JSON line: a step's time split into phases (the mean of STEPS steps after
// 3 warm-up ones, nothing observing them), then the ops and allocations of one more
// step (optimizer state exists by then) with the bytes of them it keeps past its end, and
// with --names each op's count.
// --time-only: no count (the ops and allocations are left out). peak_rss_mb is the process's
// peak after the timed steps, before any counting or profiling; start_rss_mb before the model.
// --matmul: STEPS more steps under torch's profiler, timing the matrix products (the
// kMatrixProducts below, outermost only); prints their mean a step ("matmul_ms"), the profiled
// step's time ("profiled_step_ms": the profiler adds a little to every op) and the rest
// of it ("outside_matmul_ms"). Both from one fit: the step's time moves more between fits
// on a busy machine than the part outside the matrix products is.
// --threads: torch's threads (all cores by default).
#include "bench_learner.h"

#include <mixtrain/mixtrain.h>

#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <sys/resource.h>

namespace {

/// The ops whose kernels are the matrix products: what a step bound by them spends its
/// time in, forward and backward. bench/python_step_ops.py times the same names.
constexpr const char* kMatrixProducts[] = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution", "aten::convolution_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};

/// The time a step spends in matrix products, by torch's profiler (Kineto, CPU events), as
/// bench/python_step_ops.py measures it: the kMatrixProducts events not inside another
/// one, summed over the training steps from `from` on and divided by their number; and
/// the ops outside them that take the most time of their own. The profiler observes every
/// op, which costs a little time on each: the program that dispatches more ops pays more.
class TimeMatmuls : public mixtrain::Callback {
 public:
  explicit TimeMatmuls(int64_t from) : from_(from) {}
  void before_batch(mixtrain::Learner& learn) override {
    if (!learn.training() || learn.train_iter() != from_) return;
    namespace impl = torch::profiler::impl;
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    const std::set<impl::ActivityType> cpu = {impl::ActivityType::CPU};
    torch::autograd::profiler::prepareProfiler(config, cpu);
    torch::autograd::profiler::enableProfiler(config, cpu);
    profiling_ = true;
    start_ = std::chrono::steady_clock::now();
  }
  void after_batch(mixtrain::Learner&) override {
    if (!profiling_) return;
    ++steps_;
    profiled_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }
  void after_train(mixtrain::Learner&) override {
    if (!profiling_) return;
    profiling_ = false;
    const auto result = torch::autograd::profiler::disableProfiler();
    // Each thread's events nest by time: walk them by start (a parent before its child), with
    // the open ones on a stack, to find each op's own time and whether a matrix product holds it.
    struct Span {
      uint64_t thread, start, end;
      std::string name;
      bool matmul;
    };
    std::vector<Span> spans;
    for (const auto& e : result->events()) {
      const std::string name = e.name();
      const bool matmul = std::find(std::begin(kMatrixProducts), std::end(kMatrixProducts), name) != std::end(kMatrixProducts);
      spans.push_back({e.startThreadId(), e.startNs(), e.startNs() + e.durationNs(), name, matmul});
    }
    std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) {
      return std::tie(x.thread, x.start, y.end) < std::tie(y.thread, y.start, x.end);
    });
    std::vector<double> own(spans.size());
    std::vector<bool> under_matmul(spans.size());
    std::vector<size_t> open;
    double matmul_ns = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      const Span& e = spans[i];
      while (!open.empty() && (spans[open.back()].thread != e.thread || spans[open.back()].end <= e.start)) open.pop_back();
      own[i] = static_cast<double>(e.end - e.start);
      under_matmul[i] = !open.empty() && (under_matmul[open.back()] || spans[open.back()].matmul);
      if (!open.empty()) own[open.back()] -= own[i];
      if (e.matmul && !under_matmul[i]) matmul_ns += own[i];  // the outermost: its whole time
      open.push_back(i);
    }
    const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
    ms_per_step = matmul_ns / 1e6 / steps;
    profiled_step_ms = profiled_ms_ / steps;
    // The ops outside the matrix products that take the most time of their own.
    std::map<std::string, double> outside;
    for (size_t i = 0; i < spans.size(); ++i)
      if (!spans[i].matmul && !under_matmul[i]) outside[spans[i].name] += own[i] / 1e6 / steps;
    top_outside.assign(outside.begin(), outside.end());
    std::sort(top_outside.begin(), top_outside.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
    if (top_outside.size() > 8) top_outside.resize(8);
  }
  double ms_per_step = 0;
  double profiled_step_ms = 0;  // the profiled steps' own time, the matrix products' included
  std::vector<std::pair<std::string, double>> top_outside;  // ms a step

 private:
  int64_t from_, steps_ = 0;
  bool profiling_ = false;
  std::chrono::steady_clock::time_point start_;
  double profiled_ms_ = 0;
};

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

/// The process's peak resident memory so far, in MB (getrusage's, as Python's peer reads it).
double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL BATCH [PRECISION] [torch|core] [--steps N] [--names] [--image CxHxW] [--matmul] [--threads N] [--time-only]\n", argv[0]);
    return 2;
  }
  return bench::run_guarded(argv[0], [&] {
    const double start_rss_mb = peak_rss_mb();  // libtorch loaded, nothing built
    const std::string name = argv[1];
    const int64_t bs = std::atoll(argv[2]);
    const bool has_precision = argc > 3 && std::string(argv[3]).rfind("--", 0) != 0;
    const std::string precision = has_precision ? argv[3] : "fp32";
    bool core = false, list_names = false, matmul = false, time_only = false;
    int64_t timed_steps = 20;
    std::vector<int64_t> image = {1, 28, 28};
    int threads = 0;
    for (int i = has_precision ? 4 : 3; i < argc; ++i) {
      const std::string a = argv[i];
      core = core || a == "core";
      list_names = list_names || a == "--names";
      matmul = matmul || a == "--matmul";
      time_only = time_only || a == "--time-only";
      if (a == "--steps" && i + 1 < argc) timed_steps = std::atoll(argv[++i]);
      if (a == "--image" && i + 1 < argc) image = bench::parse_shape(argv[++i]);
      if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    }
    const int64_t warmup = 3;
    const auto learn = bench::step_bench_learner(name, warmup + timed_steps, bs, precision, core, nullptr, image, threads);

    // The first fit times the steps after the warm-up ones, with nothing observing them.
    StepSplit split;
    learn->fit(1, 1e-3, {std::make_shared<SplitSteps>(&split, warmup, true), std::make_shared<SplitSteps>(&split, warmup, false)});
    nlohmann::ordered_json out = {{"model", name}, {"precision", precision}, {"loop", "mixtrain"},
                                  {"optimizer", core ? "core" : "torch"}};
    nlohmann::ordered_json phases = nlohmann::ordered_json::object();
    double step_ms = 0;
    for (size_t i = 0; i < split.ms.size(); ++i) {
      const double ms = split.ms[i] / static_cast<double>(std::max<int64_t>(split.steps, 1));
      step_ms += ms;
      phases[StepSplit::kPhases[i]] = ms;
    }
    out["step_ms"] = step_ms;
    out["phases_ms"] = phases;
    // The peak of the timed fit: the counting and profiling below hold more.
    out["start_rss_mb"] = start_rss_mb;
    out["peak_rss_mb"] = peak_rss_mb();
    // Then, with --matmul, the same steps again with the matrix products timed.
    if (matmul) {
      auto timer = std::make_shared<TimeMatmuls>(warmup);
      learn->fit(1, 1e-3, {timer});
      out["matmul_ms"] = timer->ms_per_step;
      out["outside_matmul_ms"] = timer->profiled_step_ms - timer->ms_per_step;
      out["profiled_step_ms"] = timer->profiled_step_ms;
      nlohmann::ordered_json top = nlohmann::ordered_json::object();
      for (const auto& [op, ms] : timer->top_outside) top[op] = ms;
      out["outside_top_ms"] = top;
    }
    // Then one more step is counted (optimizer state exists by now), and the fit stops after it.
    if (!time_only) {
      const mixtrain::diagnose::StepOps ops = mixtrain::diagnose::count_step_ops(*learn, 1);
      out["ops"] = ops.ops;
      out["allocations"] = ops.allocations;
      out["allocated_mb"] = ops.allocated_bytes / 1e6;
      out["kept_bytes"] = ops.kept_bytes;
      if (list_names) out["names"] = ops.by_op;
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  });
}
