#pragma once
/// Two of the three things a run can be asked to do, as library calls: train (with
/// resume, checkpoints, branches and data parallelism) and lr_find; the third, the
/// doctor, is run/doctor.h. A front end (the mixtrain CLI, the Python package) fills a
/// RunArgs from its user's words through the option table and calls one of these; it
/// adds nothing else. What every run shares (its stop flags, its turn) is run/run_control.h.

#include "mixtrain/core/lr_find.h"
#include "mixtrain/core/recorder.h"
#include "mixtrain/util/phrase.h"
#include "mixtrain/run/options.h"
#include "mixtrain/run/run_control.h"

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace mixtrain::run {

/// How a training run ended.
struct TrainResult {
  enum class End {
    kFinished,     ///< every epoch ran; model.pt and the charts are written
    kInterrupted,  ///< stopped on request; a checkpoint to resume from was written (by rank 0)
    kStopped,      ///< the loss became NaN/inf; `message` says where and the last good state's checkpoint
  } end = End::kFinished;
  std::string folder;      ///< the run folder
  std::string checkpoint;  ///< kInterrupted: the checkpoint written
  int world_size = 1;      ///< data-parallel ranks that trained it
  Phrase message;          ///< kStopped: why
  // What the run measured, as its files say it (rank 0's), so that a front end reads no file:
  std::vector<std::string> metric_names;  ///< the metric columns of `epochs`
  std::vector<EpochRecord> epochs;        ///< the Recorder's epoch rows (metrics.csv)
  std::vector<StepRecord> steps;          ///< every training step (steps.csv)
  std::string summary;                    ///< summary.json's text (empty on ranks that write none)
  std::map<std::string, std::string> charts;  ///< kFinished: "loss", "lr", "scale" -> SVG text, as written
};

/// The configuration of the run in `folder`, for `--resume`: its args.json, with
/// `threads` (>= 0) replacing the recorded thread count. Throws c10::Error naming
/// the problem (no args.json, a damaged one, a run that finished).
RunArgs resume_args(const std::string& folder, int threads = -1);

/// Trains as args say (a new run, or a resume when args.resume is set), under
/// torchrun-style environment variables one rank of a data-parallel job. Throws
/// OptionError / c10::Error for bad options and data, before anything is written.
TrainResult train(RunArgs args, const StopFlags& stop = {});

/// fastai's learning-rate finder on the model and data args name; writes
/// OUT/lr_find.svg and OUT/lr_find.csv and prints the suggestions. A stop
/// request ends the sweep with callbacks::StopRequested (the weights restored).
LrFindResult lr_find(RunArgs args, const StopFlags& stop = {});

} // namespace mixtrain::run

// run::doctor and its helpers were declared here before 0.2 (CHANGELOG.md): kept reachable
// from this header for programs written against 0.1, until 0.3.
#include "mixtrain/run/doctor.h"
