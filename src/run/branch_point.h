#pragma once
// Private to the run layer: what both branches of a run share (`mixtrain train --from` in
// branch.cpp, `mixtrain doctor --from` in doctor.cpp): the checkpoint read once, its step
// (the --at lookup), the checks that the folder is still the run it recorded, and how a
// restored run goes on in another precision (the fp16 scale carried over).

#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/run/options.h"
#include "mixtrain/run/run_config.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mixtrain::run {

/// The training step a checkpoint file holds ("checkpoint-120.pt": 120).
int64_t step_of(const std::string& path);

/// The checkpoint of `from` (`checkpoints`, newest first) at training step `at`; an
/// OptionError("at") listing the steps it has when there is none.
std::string checkpoint_at(const std::string& from, const std::vector<std::string>& checkpoints, int64_t at);

/// A checkpoint read once: every Learner built from it loads these bytes, so a run that is
/// still training (and deletes its older checkpoints, --keep) cannot take the file away
/// between two arms. The step is the checkpoint's own record, never its file name.
struct BranchPoint {
  std::string path;
  std::string bytes;
  int64_t step = -1;
  std::vector<std::string> callback_keys;  // the stateful callbacks it holds state for
};

BranchPoint read_branch_point(const std::string& checkpoint);

/// read_branch_point of a checkpoint the branch chose itself (`chosen`: no --at): a damaged
/// one names the older checkpoints that may be whole, as a resume does.
BranchPoint read_chosen_point(const std::string& checkpoint, const std::vector<std::string>& checkpoints, bool chosen);

/// Loads a branch point into `learn` as a resume does, carrying the state of callbacks the
/// Learner does not have (the run record, trackers) in sinks that go again afterwards.
void load_branch_point(Learner& learn, const BranchPoint& point);

/// The run folder's args.json, and the files it names, are what `checkpoint` recorded it was
/// trained with and on (as a resume checks): an edited lr, bs, seed, ranks, data or model,
/// a data file replaced in place, or a checkpoint copied in from another run would make the
/// branch another run, silently. Refused by name. A checkpoint of an older version records
/// nothing to check.
/// Returns the input files' fingerprints it checked (empty when the checkpoint records none).
std::map<std::string, std::string> check_recorded_run(const RunConfig& as_written, const std::string& checkpoint,
                                                      const std::string& bytes, const std::string& cannot);

/// The loss scale a branch goes on at: the run's, unless its last kMinCompareSteps steps or
/// more were all skipped (a scale that collapsed, backed off at every step, as before a NaN
/// stop; a skip or two is a scale finding its level): then the scale those skipped steps
/// started from, the last one that worked. `said` gets a sentence when it is not the run's own.
double working_scale(const Recorder& rec, double current, std::string* said = nullptr);

/// `options` for a Learner restored in the run's precision (`run_options`) that goes on in
/// `precision`: where that is fp16, the run was loss-scaled and the scaler's init_scale was
/// not changed, the scaler starts at the run's working scale (working_scale; `said` as
/// there). Both branches carry the scale over through this one rule.
PrecisionOptions with_run_scale(Learner& learn, Precision precision, PrecisionOptions options,
                                const PrecisionOptions& run_options, std::string* said = nullptr);

/// A trial's precision on a Learner restored in the run's own: to fp32, then the new mode
/// (the scale carried over: with_run_scale), then clipping when `clip` > 0.
void convert_precision(Learner& learn, Precision precision, PrecisionOptions options, double clip,
                       const PrecisionOptions& run_options);

/// A data-parallel run's flags for one process: its global batch (ranks x bs) as one
/// batch. The loader's shards are slices of one seeded permutation's global batches
/// (DataLoaderOptions::num_shards), so the one process takes each step's samples of all
/// ranks together, and the mean loss's gradient is the mean of the ranks' averaged ones.
/// Returns what that means, in words (`done`: "replayed", ...); empty for a one-process run.
std::string as_one_process(RunConfig& c, const std::string& done);

/// Whether every weight and buffer of the Learner is finite.
bool weights_finite(Learner& learn);

} // namespace mixtrain::run
