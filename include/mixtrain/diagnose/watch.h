#pragma once
/// The watch: mixed-precision health of a hand-written training loop while it trains, in
/// the doctor's words (its verdicts, its cures), at almost no cost.
///
/// Two halves, one rule:
/// - judge_watch(): the verdict from what a watch recorded. Python's mixtrain.watch and
///   diagnose::Watch below both ask it, so the thresholds and the evidence's words live here.
/// - diagnose::Watch: the recorder for a libtorch loop over amp::GradScaler and any
///   torch::optim::Optimizer (the lost-update count is exact, every step, with mixtrain::optim's;
///   sampled with libtorch's).
///
/// Example (one line after the update, the loop otherwise unchanged):
///   mixtrain::diagnose::Watch watch(*model, opt, &scaler);   // every 100 steps by default
///   for (...) {
///     opt.zero_grad();
///     { mixtrain::amp::autocast guard(device, torch::kHalf); loss = loss_fn(model->forward(x), y); }
///     scaler.scale(loss).backward();
///     scaler.step(opt);
///     scaler.update();
///     watch.after_step();
///   }
///   std::cout << watch.report();   // verdict, evidence, the lines to paste, the doctor's call
///
/// What it records, and what it costs:
/// - the loss scale after every update and the skipped steps (a step whose update backed the
///   scale off): amp::GradScaler keeps the scale on the host, so this reads nothing;
/// - on every overflowing step (up to kWatchedOverflowSteps of them), which parameters'
///   gradients were not finite: flags kept on the device, read once per `every` steps;
/// - on sampled steps (every `every`-th, the first included), the largest |output| of each
///   module against its dtype's largest value, so an overflow is placed at a module. The
///   module is the ModuleScope an op runs in (the built-in models, TorchScript models), else
///   the module whose parameter the op reads; the op tracer sees the forward of that step only;
/// - with mixtrain::optim, the element updates rounding threw away, counted by the update
///   pass itself (exact, every step). libtorch's own optimizers do not expose their update:
///   on sampled steps the 16-bit weights are compared with a copy taken before the step,
///   counting the elements with a nonzero gradient that it left unchanged (the evidence
///   says so).
///
/// It warns once (mixtrain::warn) when a verdict's rule is met, and never changes what the
/// loop computes: the weights are bitwise those of the loop unwatched (tested).

#include "mixtrain/diagnose/diagnosis.h"

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <iosfwd>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace mixtrain::amp {
class GradScaler;
} // namespace mixtrain::amp

namespace mixtrain::diagnose {

/// A module output within this share of its dtype's largest finite value is about to overflow.
constexpr double kNearOverflow = 0.25;
/// This share of the element updates rounded away (nearest): the loop barely learns.
constexpr double kLostUpdatesMost = 0.75;
/// The overflowing steps whose non-finite gradients are named (the first ones).
constexpr int64_t kWatchedOverflowSteps = 8;
/// The steps the doctor's call the watch suggests would replay.
constexpr int64_t kWatchDoctorSteps = 50;

/// One module's largest |output| on a sampled step, against its dtype's largest finite value.
struct ModuleRange {
  std::string module;
  double largest = 0;  ///< NaN or inf when the output was not finite
  double limit = 0;
};

/// What a watch recorded, in the form judge_watch reads.
struct WatchEvidence {
  int64_t steps = 0;   ///< optimizer updates watched
  int64_t every = 1;   ///< the sampling interval
  /// The scaler's scale before the first step, and after every update (empty without a scaler).
  double initial_scale = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> scales;
  /// Per sampled step, its modules in forward order.
  struct Sample {
    int64_t step = 0;
    std::vector<ModuleRange> modules;
  };
  std::vector<Sample> ranges;
  /// Per overflowing step, the parameters whose gradient was not finite.
  struct NonfiniteGrads {
    int64_t step = 0;
    std::vector<std::string> params;
  };
  std::vector<NonfiniteGrads> nonfinite_grads;
  /// Element updates of the 16-bit parameters: intended (nonzero in fp32) and lost to rounding.
  struct Lost {
    std::string param;
    int64_t intended = 0, lost = 0;
  };
  std::vector<Lost> lost;
  std::string weight_update = "nearest";  ///< the rule the updates were rounded by
  std::string lost_counted;               ///< how they were counted, said in the evidence
};

/// The watch's verdict, in the doctor's catalogue words.
struct WatchReport {
  std::string verdict = "healthy";   ///< forward_overflow, gradient_overflow, lost_updates or healthy
  std::vector<std::string> evidence;
  std::vector<Setting> cure;         ///< the settings the catalogue tries first for the verdict
  int64_t steps = 0;
};

/// The steps whose update backed the scale off, and how many of them came first in a row
/// (the scaler settling from its initial scale).
struct WatchSkips {
  std::vector<int64_t> steps;
  int64_t settling = 0;
};
WatchSkips watch_skips(const WatchEvidence& evidence);

/// The verdict (the first rule met, in this order):
/// - forward_overflow: a module's output within kNearOverflow of its dtype's largest value
///   (or not finite) on a sampled step; the first such module in forward order;
/// - gradient_overflow: the scale collapsed (fell to <= 1), or at least kSkipRateMost of the
///   steps after settling (8 or more) were skipped;
/// - lost_updates: under nearest rounding, at least kLostUpdatesMost of the intended element
///   updates were lost;
/// - healthy otherwise, with what was measured as its evidence.
WatchReport judge_watch(const WatchEvidence& evidence);

/// `settings` as the lines a libtorch loop pastes (`ours`: its optimizer is mixtrain::optim's).
std::vector<std::string> cpp_loop_lines(const std::vector<Setting>& settings, bool ours);

/// Each module's largest |output| while it runs (a sampled step's forward), by the op tracer:
/// the module is the ModuleScope an op runs in (the built-in models; TorchScript's module calls),
/// else the module whose parameter (or autocast's copy of one) the op reads. Backward ops (grad
/// mode off) are not counted. Values stay on the device until the caller reads them.
/// diagnose::Watch uses it, and Python's watch for a TorchScript model, whose submodules take no
/// forward hooks.
class ModuleRangeTracer {
 public:
  /// `named_params`: the model's parameters by name ("encoder.proj.weight").
  explicit ModuleRangeTracer(const std::vector<std::pair<std::string, torch::Tensor>>& named_params);
  ~ModuleRangeTracer();
  ModuleRangeTracer(const ModuleRangeTracer&) = delete;
  ModuleRangeTracer& operator=(const ModuleRangeTracer&) = delete;

  struct Range {
    std::string module;
    torch::Tensor largest;  ///< a 0-d float tensor on the op's device
    double limit = 0;       ///< its dtype's largest finite value
  };
  /// Starts seeing this thread's ops (a no-op while running).
  void start();
  /// Stops, and hands back the modules seen since start(), in forward order. Only the thread
  /// that started it can: from another, throws and changes nothing (destroyed there, it is
  /// left installed but inert, since a thread's dispatcher state is its own).
  std::vector<Range> stop();
  bool running() const;

 private:
  struct Observer;
  std::unique_ptr<Observer> observer_;
};

struct WatchOptions {
  /// Sample one step in this many (module ranges) and read the device's records this often.
  TORCH_ARG(int64_t, every) = 100;
};

/// The recorder for a libtorch loop (see the file comment). Not copyable; one per model.
class Watch {
 public:
  /// Throws OptionError for every < 1, a model with no trainable parameter, or a model
  /// another live Watch is watching. `scaler` may be null (a bf16 loop).
  Watch(torch::nn::Module& model, torch::optim::Optimizer& optimizer, amp::GradScaler* scaler = nullptr,
        WatchOptions options = {});
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  /// Call once per iteration after the update (scaler.update(), or optimizer.step()), before
  /// the gradients are zeroed, on the thread that made the watch (a sampled step's tracer is
  /// that thread's; another thread gets a one-line error).
  void after_step();
  /// The verdict so far; reads what the current block left on the device.
  const WatchReport& report();
  /// The verdict as the user reads it: verdict, evidence, the lines to paste, the doctor's call.
  std::string report_text();
  /// Everything recorded so far (after a read).
  const WatchEvidence& evidence();
  /// The scale and skip chart the doctor draws ("" without a scaler).
  std::string plot();
  /// Ends the watch: the last read, the tracer removed. The destructor calls it.
  void close();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::ostream& operator<<(std::ostream& out, Watch& watch);

} // namespace mixtrain::diagnose
