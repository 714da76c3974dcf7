#pragma once
/// RunFolder: the run-folder protocol, owned in one place. A run folder holds
/// args.json (the configuration, so a resume needs nothing else), checkpoints and
/// `latest`, metrics.csv / steps.csv / summary.json, `finished` once the run
/// completed (so it is not resumed into a retrain), model.pt and the run charts.

#include "mixtrain/core/learner.h"
#include "mixtrain/run/run_config.h"

#include <map>
#include <string>

namespace mixtrain::run {

class RunFolder {
 public:
  explicit RunFolder(std::string path) : path_(std::move(path)) {}
  /// runs/<prefix><timestamp>-<pid>: unique for runs started in the same second.
  static std::string default_path(const std::string& prefix);
  /// The folder a path names once it is created: `OLD/x/..` (x not there yet) is OLD, and a
  /// trailing separator goes. Checks on the path as given would look into a folder that does
  /// not exist and find nothing, while creating it lands in OLD. Relative where the path's
  /// plain lexical form names the same folder, else absolute.
  static std::string resolve(const std::string& path);

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  /// Creates the folder and proves it writable before anything trains; throws
  /// OptionError("out") naming the problem.
  void prepare() const;
  /// Whether it holds a complete checkpoint (a killed writer's temp file is none).
  bool holds_checkpoints() const;
  /// Whether it holds a run: its args.json or a checkpoint.
  bool holds_run() const;
  /// Refuses a folder that holds a run (OptionError("out")): `who` writes its own files
  /// there, which would overwrite the run's (its charts, its summary).
  void refuse_run(const std::string& who) const;
  /// A new run's folder (train's --out): refuses one that holds a finished run (with or
  /// without checkpoints) or a run's checkpoints (OptionError("force")), unless `force`,
  /// saying what to do instead. A run that stopped before its first checkpoint left
  /// nothing to keep, and its folder is taken. The CLI's train and Python's train ask it
  /// before anything runs.
  void refuse_unless_forced(bool force) const;
  /// A forced new run: the old run's checkpoints and `latest` go.
  void clear_checkpoints() const;
  /// Temp files of writers that are no longer running go (a run killed mid-write).
  void remove_dead_temp_files() const;
  /// The newest checkpoint, or "" when there is none.
  std::string latest_checkpoint() const;
  /// Whether the run finished its epochs (then there is nothing to resume).
  bool finished() const;
  void mark_finished(int64_t epochs) const;
  /// A new run (force) in an old run's folder is not finished.
  void clear_finished() const;

  void write_config(const RunConfig& config) const { config.write(path_); }
  RunConfig read_config() const { return RunConfig::read(path_); }
  /// model.pt: TorchScript for a scripted model (torch.jit.load reads it), else the built-in's weights.
  void write_model(const Model& model, const std::string& builtin_name) const;
  /// loss.svg, lr.svg and, with a loss scale, scale.svg; returns them by name ("loss", "lr", "scale").
  std::map<std::string, std::string> write_charts(const Recorder& recorder) const;

 private:
  std::string path_;
};

/// "mixtrain train", or the launch line a run of `ranks` data-parallel ranks goes on with:
/// what a message names to continue the run in a folder (--resume, --from).
std::string train_command(int ranks);

} // namespace mixtrain::run
