#pragma once
/// The doctor as library calls: the fp32-vs-mixed comparison of a run, its verdict and the
/// trials of its fixes, three ways:
/// - from scratch: both runs trained from the same initial weights (diagnose::compare);
/// - from a run's checkpoint (RunArgs::from_run, `mixtrain doctor --from RUN_DIR [--at STEP]
///   [--window N]`): the checkpoint restored exactly as --resume restores it and a window
///   of the run replayed from there, in fp32 and in the run's precision
///   (diagnose::compare_branch): its cost is (2 + trials) windows, whatever the run's length;
/// - from a training loop's state (RunArgs::loop, run/loop_state.h): the loop's next
///   batches replayed from its weights and optimizer state.
/// The three share one path for their folder, for diagnosis.json while they run (kept with
/// the verdict before the first trial, marked "interrupted" by a stop) and for their outputs.
#include "mixtrain/diagnose/compare.h"
#include "mixtrain/diagnose/diagnosis.h"
#include "mixtrain/run/run_control.h"
#include "mixtrain/run/options.h"

#include <cstdint>
#include <map>
#include <string>

namespace mixtrain::run {

/// Steps replayed when --window is not given (or what the run's schedule has left, if
/// fewer): at least the 8 the verdict's rules need, enough that the smoothed loss (a
/// 0.98 moving average, ~50 steps of memory) reflects the window rather than the steps
/// before it, and that lost updates and the loss scale's backoffs show; small enough
/// that 2 arms and 4 trials stay 600 steps, whatever the run's length.
constexpr int64_t kDefaultWindow = 100;

/// The doctor of `args`: from RunArgs::from_run, from RunArgs::loop, else from scratch.
/// Writes OUT/diagnosis.json and the charts, and prints the report with options named in
/// `words`. A stop request ends it with callbacks::StopRequested after the batch in flight
/// (diagnosis.json then holds the verdict as "interrupted", once there is one).
diagnose::Diagnosis doctor(RunArgs args, const OptionWords& words = api_words(), const StopFlags& stop = {});

/// The doctor of RunArgs::from_run: reads RUN_DIR/args.json and a checkpoint (at
/// RunArgs::at, or chosen: for a run that went wrong, the newest checkpoint before it did
/// with a window that reaches past it; else the state a stopped run stopped in; else the
/// newest the run went on from for a whole window), shows the run's own record, replays
/// the window and checks the replay against the run's steps.csv (Diagnosis::replay).
/// Writes only into RunArgs::out. Bad input (no args.json, no or a damaged checkpoint, an
/// unknown step, a window too short or past the schedule's end, flags that would change
/// the run) throws OptionError or c10::Error naming it.
diagnose::Diagnosis doctor_from(RunArgs args, const OptionWords& words, const StopFlags& stop);

/// The doctor of a training loop's state (RunArgs::loop): the next window of the loop
/// (args' data: the window's batches, in order; its batch size is args' bs) replayed
/// from the model's weights and the optimizer's state, in fp32 and in args' precision,
/// at the optimizer's constant learning rate; then the verdict and trials as
/// doctor_from gives them. Diagnosis::replay says where it started; matches_run is
/// nullopt (a loop records no steps to check the replay against).
diagnose::Diagnosis doctor_from_loop(RunArgs args, const OptionWords& words, const StopFlags& stop);

/// The doctor's charts by name: "loss" (both runs and the trials) and, with a loss scale,
/// "scale"; what mixtrain doctor writes as loss.svg and scale.svg.
std::map<std::string, std::string> doctor_charts(const diagnose::Diagnosis& d);

/// Refuses, naming the modes it takes, a precision the doctor does not compare with fp32
/// (PrecisionMode::doctor_compares).
void check_doctor_compares(Precision precision);

/// A doctor trial's setting applied through the option table: the row of `setting.key`
/// sets its value on `run` as it would from the command line (OptionError for a value the
/// row refuses). What diagnose::compare's trials use.
void apply_setting(const diagnose::Setting& setting, diagnose::MixedRun& run);

} // namespace mixtrain::run
