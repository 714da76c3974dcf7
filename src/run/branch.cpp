// Branching a run with `mixtrain train --from` (mixtrain/run/branch.h): a new run that
// continues another's schedule from one of its checkpoints, possibly in another precision.
// What the doctor's branch shares with it is in branch_point.h.
#include "mixtrain/run/branch.h"

#include "branch_point.h"

#include "mixtrain/callbacks/checkpointer.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/parallel/distributed.h"
#include "mixtrain/run/learner_builder.h"
#include "mixtrain/run/run_folder.h"
#include "mixtrain/util/option_error.h"

#include <filesystem>
#include <iostream>
#include <set>

namespace mixtrain::run {

namespace {
/// A row of the precision mode's settings: the mode, or an option of it.
bool sets_the_precision(const Option& o) {
  return o.key == "precision" || o.key == "weight_update" || o.key == "dynamic" || !o.modes.empty();
}
/// What train --from may change: how the run computes, not what it trains on or how long.
bool changes_only_how_it_computes(const Option& o) {
  static const std::set<std::string> kept{"threads", "thread_policy", "clip", "save_every", "save_every_steps", "keep",
                                          "max_bad_steps"};
  return kept.count(o.key) > 0 || sets_the_precision(o);
}
} // namespace

BranchStart start_from_run(RunArgs& a) {
  BranchStart start;
  start.from = a.from_run;
  if (!a.resume.empty())
    throw OptionError("from_run", Phrase::name("from_run") + " starts a new run from another run's checkpoint, " +
                                      Phrase::name("resume") + " continues a run in its own folder: pass one of them");
  std::error_code ec;
  if (!std::filesystem::is_directory(start.from, ec))
    throw OptionError("from_run", Phrase::name("from_run") + " " + start.from + " is not a run folder (no such directory, or not a directory)");
  try {
    start.trained = RunFolder(start.from).read_config();
  } catch (const c10::Error& e) {
    throw OptionError("from_run", "cannot start from " + start.from + ": " + e.msg());
  }
  const RunConfig as_written = start.trained;  // args.json, before one process takes the ranks' batch
  // The same ranks go on with the same batch per rank; one process takes their global batch.
  const int world = distributed::env_from_environment().world_size;
  const int ranks = start.trained.ranks;
  if (world != ranks && world != 1)
    throw OptionError("from_run", "cannot start " + std::to_string(world) + " ranks from " + start.from + ": it was trained by " +
                                      std::to_string(ranks) + (ranks > 1 ? " ranks" : " process") +
                                      ", and another count would change its global batch; continue it with " +
                                      train_command(ranks) + " " + Phrase::name("from_run") + " " + start.from);
  if (world == 1) start.one_process = as_one_process(start.trained, "continued");
  // The new run: the run's own flags, with the given ones that change only how it computes.
  const RunArgs defaults = defaults_for(Command::kTrain);
  RunArgs merged = a;
  merged.config = start.trained;
  for (const Option& o : options()) {
    if (!o.stored || o.key == "ranks" || !was_given(o, a, defaults)) continue;
    const std::string given = o.get(a);
    if (!changes_only_how_it_computes(o))
      throw OptionError(o.key, Phrase::name("from_run") + " continues " + start.from + "'s schedule on its model and data: " +
                                   Phrase::name(o.key) + " would make it another run (drop it, or start a new run without " +
                                   Phrase::name("from_run") + ")");
    o.set(merged, given);
  }
  a.config = merged.config;
  a.config.ranks = 1;
  if (a.out.empty()) a.out = RunFolder::default_path("");
  a.out = RunFolder::resolve(a.out);
  if (std::filesystem::weakly_canonical(a.out, ec) == std::filesystem::weakly_canonical(start.from, ec))
    throw OptionError("out", Phrase::name("from_run") + " starts a new run: give it its own " + Phrase::name("out") +
                                 ", not " + start.from);
  const std::vector<std::string> checkpoints = callbacks::Checkpointer::newest_first(start.from);
  if (checkpoints.empty())
    throw OptionError("from_run", "cannot start from " + start.from + ": it holds no checkpoint");
  if (a.at < -1) throw OptionError("at", "invalid " + Phrase::name("at") + " " + std::to_string(a.at) + ": a training step is >= 0");
  if (a.at >= 0) {
    start.checkpoint = checkpoint_at(start.from, checkpoints, a.at);
  } else {
    start.checkpoint = checkpoints.front();
    if (RunFolder(start.from).finished())
      throw OptionError("at", start.from + " finished its schedule: its newest checkpoint leaves nothing to train; pick an "
                                           "earlier one with " + Phrase::name("at"));
  }
  const BranchPoint point = read_chosen_point(start.checkpoint, checkpoints, a.at < 0);
  start.step = point.step;
  start.inputs = check_recorded_run(as_written, start.checkpoint, point.bytes, "cannot start from " + start.from);
  return start;
}

void restore_branch(Learner& learn, const BranchStart& start, const RunConfig& now) {
  const RunConfig& was = start.trained;
  const PrecisionOptions run_options = PrecisionOptions(was.precision_options).rounding_seed(was.seed);
  learn.set_precision(was.precision, run_options);
  load_branch_point(learn, read_branch_point(start.checkpoint));
  const int64_t left = now.epochs * learn.dls().train.num_batches() - start.step;
  if (left <= 0)
    throw OptionError("at", start.checkpoint + " is the end of " + start.from + "'s schedule: nothing is left to train; pick an "
                                               "earlier one with " + Phrase::name("at"));
  // The same precision settings: the run's state goes on untouched (a resume in a new folder).
  RunArgs before, after;
  before.config = was;
  after.config = now;
  bool same = true;
  for (const Option& o : options())
    if (o.stored && sets_the_precision(o) && o.get(before) != o.get(after)) same = false;
  if (same) {
    add_fit_warning(learn, now.precision);
    return;
  }
  // The new mode, with the run layer's own attachments (the end-of-fit warning); a scaler
  // whose settings did not change goes on at the run's scale.
  RunConfig mode = now;
  std::string said;
  mode.precision_options = with_run_scale(learn, now.precision, now.precision_options, was.precision_options, &said);
  if (!said.empty()) std::cout << "mixtrain train: " << said << std::endl;
  learn.to_fp32();
  set_precision(learn, mode);
  // Another precision is another run from here: its smoothed loss and its counts start
  // here (a parent's NaN would stay in the smoothed loss, its skips in summary.json's).
  learn.recorder().start_branch();
}

} // namespace mixtrain::run
