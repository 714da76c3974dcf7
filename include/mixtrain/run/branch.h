#pragma once
/// Branching a run: `mixtrain train --from RUN_DIR [--at STEP] --out NEW_DIR [flags]`
/// starts a new run from one of a run's own checkpoints, restored exactly as --resume
/// restores it (weights, optimizer state, loss scale, schedule position, data order,
/// random state), and continues its schedule, possibly in another precision. The doctor's
/// branch (`mixtrain doctor --from`) is in run/doctor.h.
#include "mixtrain/core/learner.h"
#include "mixtrain/run/options.h"

#include <cstdint>
#include <map>
#include <string>

namespace mixtrain::run {

/// Where `mixtrain train --from RUN_DIR [--at STEP] --out NEW_DIR [flags]` starts.
struct BranchStart {
  std::string from;        ///< the run folder
  std::string checkpoint;  ///< the checkpoint branched from
  int64_t step = 0;        ///< its training step
  RunConfig trained;       ///< the run's own args.json (a data-parallel run's in one process: see one_process)
  /// Non-empty when a run of several ranks goes on in one process, with their global
  /// batch as its batch: what that means, in words.
  std::string one_process;
  /// The run's input files' fingerprints as checked against the checkpoint's record (the new
  /// run records them too; empty for a checkpoint of an older version, which records none).
  std::map<std::string, std::string> inputs;
};
/// For train --from: reads RUN_DIR/args.json and puts on top of it the flags `args` was
/// given that change only how the run computes (the precision and its options, clipping,
/// threads, checkpoints); any other (the model, the data, bs, the schedule) is refused
/// naming it, since it would make another run. `args.config` becomes the new run's.
/// Picks the checkpoint: RunArgs::at, or the newest. Throws OptionError / c10::Error.
BranchStart start_from_run(RunArgs& args);
/// Loads the branch point into `learn` (built for the new run, no precision attached
/// yet): in the run's own precision, exactly as a resume would, then converted to
/// `now`'s precision (run::set_precision), the loss scale carried over where the
/// scaler's settings did not change. The next fit continues the run's schedule.
void restore_branch(Learner& learn, const BranchStart& start, const RunConfig& now);

} // namespace mixtrain::run

// The doctor's branch (run::doctor_from, kDefaultWindow) and a training loop's state
// (run::LoopState, doctor_from_loop) were declared here before 0.2 (CHANGELOG.md): kept
// reachable from this header for programs written against 0.1, until 0.3.
#include "mixtrain/run/doctor.h"
#include "mixtrain/run/loop_state.h"
