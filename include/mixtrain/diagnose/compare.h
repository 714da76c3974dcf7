#pragma once
/// The fp32-vs-fp16 comparison protocol as a function: an fp32 baseline and a mixed-precision
/// run with the same seed, the same initial weights, the same data order and
/// the same schedule, then a verdict from what they measured.

#include "mixtrain/amp/grad_scaler.h"
#include "mixtrain/diagnose/diagnosis.h"
#include "mixtrain/amp/precision_options.h"

#include <torch/arg.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mixtrain {
class Learner;
}

namespace mixtrain::diagnose {

/// The fewest training steps per run that compare() judges: the start loss is the
/// mean of the first 5 steps, and the end must be measured after them.
constexpr int64_t kMinCompareSteps = 8;

/// Builds a fresh Learner (model, data, loss) in fp32. compare() calls it twice;
/// the second model's weights are overwritten with the first one's initial
/// weights, and both see the same data order when the loaders are seeded.
using LearnerFactory = std::function<std::unique_ptr<Learner>()>;

/// What a trial may change in the mixed run: its precision mode and options, and
/// gradient clipping (0: none beyond what the factory's Learner has).
struct MixedRun {
  Precision precision = Precision::kFp16;
  PrecisionOptions options;
  double clip = 0;
};
/// Applies one of a fix's settings (an option key and its value as text) to a
/// trial's mixed run. run::apply_setting does it through the option table.
using SettingApplier = std::function<void(const Setting& setting, MixedRun& run)>;

struct CompareOptions {
  TORCH_ARG(int64_t, epochs) = 1;
  TORCH_ARG(double, lr) = 1e-3;
  /// The mixed precision compared with fp32: Precision::kFp16, kBf16 or kBf16Pure.
  TORCH_ARG(Precision, precision) = Precision::kFp16;
  /// The mixed run's options: its scaler, emulation and fp32 islands.
  TORCH_ARG(PrecisionOptions, precision_options);
  /// torch's global seed, set before building each Learner and before each fit.
  TORCH_ARG(uint64_t, seed) = 42;
  /// fit_one_cycle (fastai's default) or a constant-lr fit.
  TORCH_ARG(bool, one_cycle) = true;
  /// After a problem verdict, try at most this many candidate fixes (0: none).
  /// Each trial costs one mixed run; a healthy model costs none.
  TORCH_ARG(int64_t, max_trials) = 4;
  /// How a fix's settings change a trial's run: run::apply_setting (the option
  /// table's setters). Without one no fix is tried.
  TORCH_ARG(SettingApplier, apply_setting) = nullptr;
  /// Called with the verdict and its evidence before any trial runs, and again as
  /// each trial ends (the trials so far, the proven fix among them), so that a
  /// caller can keep the diagnosis when a later trial dies or is stopped.
  TORCH_ARG(std::function<void(const Diagnosis&)>, on_progress) = nullptr;
  /// From scratch on a CPU with 2 or more intra-op threads: train the fp32 baseline on
  /// a second thread beside the run under diagnosis, each on half the threads (small
  /// models gain little from a second thread, so the pair costs less than the two in
  /// turn). Only where that changes no result: the model draws no random numbers while
  /// it trains (no dropout), the two models share no tensors and no data-parallel group
  /// is attached. Each arm then computes exactly what it would alone on half the
  /// threads; Evidence::side_by_side says whether it happened. When the baseline ends
  /// first and the run so far is likely to get a verdict whose first trial needs no
  /// evidence (bf16-pure rounding to nearest that lost a quarter of its updates:
  /// lost_updates, whose first trial is stochastic rounding), that trial may start on the
  /// baseline's threads (head_start). Off unless asked: the
  /// baseline's callbacks then run on another thread, and a factory's callbacks that
  /// share state between the Learners would race. run::doctor (the CLI, Python)
  /// asks: its Learners share nothing. compare_branch takes it too (the fp32 arm and the
  /// run's replayed side by side; no head start): the doctor of a training loop asks,
  /// and the doctor of a run's checkpoint does not, since its replay must compute what
  /// the run computed, at the run's thread count, to be checked against its steps.csv.
  TORCH_ARG(bool, side_by_side) = false;
  /// With side_by_side: start lost_updates' first trial on the baseline's threads once the
  /// baseline has ended; it goes on with every thread if the verdict agrees, else stops
  /// (Trial::head_start). Off by default: where it switches from half the threads to all
  /// depends on when the run under diagnosis ends, and the CPU's bf16 kernels round
  /// differently on different thread counts, so the trial's numbers (its gap) would differ
  /// between two doctors of the same run. Without it two doctors on one machine and thread
  /// count give bitwise the same report.
  TORCH_ARG(bool, head_start) = false;
  /// Called every few milliseconds on the calling thread while it waits for the run under
  /// diagnosis on the second (side by side): where a front end checks for a stop that only
  /// its main thread can see (Python's signal handlers), and raises the flag the run's
  /// callbacks stop on.
  TORCH_ARG(std::function<void()>, while_waiting) = nullptr;

  /// 0.1.0's fields, now those of precision_options(); removed in 0.3.0.
  [[deprecated("use precision_options(PrecisionOptions().scaler(...))")]] CompareOptions& scaler(amp::GradScalerOptions s) {
    precision_options_.scaler(s);
    return *this;
  }
  [[deprecated("use precision_options(PrecisionOptions().allow_fp16_emulation(...))")]] CompareOptions& allow_fp16_emulation(bool a) {
    precision_options_.allow_fp16_emulation(a);
    return *this;
  }
  [[deprecated("use precision_options(PrecisionOptions().keep_fp32(...))")]] CompareOptions& keep_fp32(std::vector<std::string> k) {
    precision_options_.keep_fp32(std::move(k));
    return *this;
  }
};

/// Runs the pair and decides. The Learners' Recorders hold the full histories;
/// the evidence keeps per-step losses, scales and skips for plotting. After a
/// problem verdict (forward_overflow, gradient_overflow, underflow) it tries up to
/// max_trials candidate fixes (the verdict's catalogue entry says which; their
/// settings applied by apply_setting), each a mixed run from the same initial
/// weights, seed and data order, judged by the same rules, and names the best proven one:
/// - forward_overflow: keep the overflowing module in fp32 (adding the next
///   overflowing module while a trial still overflows), then bf16;
/// - gradient_overflow: a lower initial scale, gradient clipping, bf16, an fp32
///   island for the layer whose gradients overflow;
/// - underflow: a higher initial scale, a shorter growth interval, bf16.
Diagnosis compare(const LearnerFactory& make_learner, const CompareOptions& options = {});
/// The same with the common arguments.
Diagnosis compare(const LearnerFactory& make_learner, int64_t epochs, double lr);

/// Which Learner a BranchFactory builds at the branch point.
enum class Arm {
  kRun,    ///< the run itself, continued: its precision and state exactly as a resume restores them
  kFp32,   ///< fp32 from the same state: the masters where the run kept them, bf16-pure's values as
           ///< fp32, the optimizer state as it is; no autocast, no loss scaling
  kTrial,  ///< the run's state in a trial's precision, options and clipping (the MixedRun)
};
/// Builds a Learner at a run's branch point (a checkpoint restored as a resume restores
/// it: weights, optimizer, scaler, schedule position, data order and random state) as
/// `arm` says; `trial` is the MixedRun for Arm::kTrial (the run's own otherwise).
using BranchFactory = std::function<std::unique_ptr<Learner>(Arm arm, const MixedRun& trial)>;

/// The comparison replayed from a run's checkpoint (mixtrain doctor --from): `window`
/// steps of the run's schedule (options.epochs() and lr() must be the run's) in fp32 and
/// in the run's precision (options.precision()), on the same batches, each validated at
/// the end; then the verdict by the same rules (Evidence::branched set), and the
/// verdict's trials, each the window again from the same checkpoint. Its cost is
/// (2 + trials) windows, whatever the run's length, or about (1 + trials) with
/// options.side_by_side() where the two arms can train beside each other. Throws
/// OptionError("window") below kMinCompareSteps.
Diagnosis compare_branch(const BranchFactory& at_branch, const CompareOptions& options, int64_t window);

/// What a finished run's Recorder says: every step it recorded, and the last epoch;
/// its lost updates and its bytes per parameter.
RunEvidence summarize_run(Learner& learn, const std::string& precision);
/// What a parameter costs in the Learner's mode: weight, gradient, optimizer state
/// and any master copy or compensation, in bytes.
double bytes_per_param(Learner& learn);

} // namespace mixtrain::diagnose
