#pragma once
/// The three things a run can be asked to do, as library calls: train (with
/// resume, checkpoints and data parallelism), lr_find, and the doctor. A front
/// end (the mixtrain CLI, the Python package) fills a RunArgs from its user's
/// words through the option table and calls one of these; it adds nothing else.

#include "mixtrain/diagnose/compare.h"
#include "mixtrain/diagnose/diagnosis.h"
#include "mixtrain/core/lr_find.h"
#include "mixtrain/util/phrase.h"
#include "mixtrain/run/options.h"

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace mixtrain::run {

/// Asynchronous stop requests (a front end's Ctrl-C): the first request makes
/// the run checkpoint after the current batch and end.
struct StopFlags {
  std::atomic<bool>* requested = nullptr;  ///< set by the front end
  std::atomic<bool>* agreed = nullptr;     ///< data parallel: the request, agreed by every rank
  /// Set by train once a stop would be saved (the first training batch has ended).
  /// Until then a front end may end the process at once on a stop signal: there
  /// is nothing to save, and a forward that never returns must not hold it.
  std::atomic<bool>* armed = nullptr;
  /// Asked between batches, on the run's own thread, whether to stop; true sets
  /// `requested`. Python's signal handlers (signal.alarm's, say) run only there.
  std::function<bool()> poll;
};

/// What makes a run's Learner stop on request: the front end's poll, and for a run that
/// keeps no checkpoints StopOnRequest (a training run's Checkpointer saves, then stops).
void add_stop_callbacks(Learner& learn, const StopFlags& stop, bool keeps_checkpoints);

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

/// Runs in one process take turns. What a run sets is the process's, not the run's:
/// libtorch's and OpenBLAS's thread counts, the autocast cast cache, the standard
/// streams a front end redirects. train, lr_find and doctor each hold a turn for
/// their whole run; a front end may hold one around its own setup too (Python's,
/// around its stream redirects). A thread that holds the turn may take it again; a
/// second thread waits, and says so once.
class RunTurn {
 public:
  RunTurn();
  ~RunTurn();
  RunTurn(const RunTurn&) = delete;
  RunTurn& operator=(const RunTurn&) = delete;
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

/// The fp32-vs-mixed comparison and its verdict; writes OUT/diagnosis.json and
/// the charts, and prints the report with options named in `words`. A stop
/// request ends it with callbacks::StopRequested after the batch in flight.
diagnose::Diagnosis doctor(RunArgs args, const OptionWords& words = api_words(), const StopFlags& stop = {});

/// The doctor's charts by name: "loss" (both runs and the trials) and, with a
/// loss scale, "scale"; what mixtrain doctor writes as loss.svg and scale.svg.
std::map<std::string, std::string> doctor_charts(const diagnose::Diagnosis& d);

/// "mixtrain train", or the launch line a run of `ranks` data-parallel ranks goes on with.
std::string train_command(int ranks);

/// Refuses, naming the modes it takes, a precision the doctor does not compare with fp32
/// (PrecisionMode::doctor_compares).
void check_doctor_compares(Precision precision);

class RunFolder;
/// The doctor's files in its own folder (diagnosis.json, its charts), then the report
/// (unless RunArgs::says_report is false) followed by `next` (what to run with the
/// proven fix, in the front end's words), and the files written (RunArgs::report_files).
void write_doctor_outputs(const diagnose::Diagnosis& d, const RunFolder& folder, const OptionWords& words, const RunArgs& a,
                          const std::string& next);

/// diagnosis.json while a doctor runs, one path for the three doctors (from scratch,
/// --from, a training loop's state): kept with the verdict before the first trial and again
/// as each trial ends; from then on a stop has something to keep (StopFlags::armed), and a
/// stop marks it "interrupted" and says where it is.
class DoctorProgress {
 public:
  /// `keeps_files`: the folder stays once the doctor returns (RunArgs::report_files; Python
  /// without out= removes it, so a stop does not point into it).
  DoctorProgress(const RunFolder& folder, const OptionWords& words, const StopFlags& stop, bool keeps_files = true)
      : folder_(folder), words_(words), stop_(stop), keeps_files_(keeps_files) {}
  /// Keeps `now` (CompareOptions::on_progress, after the doctor added what it knows).
  void keep(const diagnose::Diagnosis& now);
  /// Runs `compare`; a stop once the verdict is known writes it as interrupted, says so on
  /// stderr and is rethrown (a stop before it is rethrown as it is: nothing to keep).
  diagnose::Diagnosis run(const std::function<diagnose::Diagnosis()>& compare);

 private:
  const RunFolder& folder_;
  const OptionWords& words_;
  StopFlags stop_;
  bool keeps_files_ = true;
  std::optional<diagnose::Diagnosis> known_;
};

/// A doctor trial's setting applied through the option table: the row of
/// `setting.key` sets its value on `run` as it would from the command line
/// (OptionError for a value the row refuses). What diagnose::compare's trials use.
void apply_setting(const diagnose::Setting& setting, diagnose::MixedRun& run);

} // namespace mixtrain::run
