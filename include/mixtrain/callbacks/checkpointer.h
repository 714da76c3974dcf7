#pragma once
/// Periodic and on-interrupt checkpoints in a run directory.

#include "mixtrain/core/callback.h"

#include <torch/arg.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain::callbacks {

/// A flag a signal handler sets to ask for a stop.
using StopFlag = const std::atomic<bool>*;
/// A flag the Checkpointer sets for a signal handler to read.
using ArmedFlag = std::atomic<bool>*;

/// Checkpointer's options.
struct CheckpointerOptions {
  /// `dir`: the run directory the checkpoints go to.
  explicit CheckpointerOptions(std::string dir) : dir_(std::move(dir)) {}
  TORCH_ARG(std::string, dir);
  /// Save at the end of every `every`-th epoch and of the last one (0: only on a stop request).
  TORCH_ARG(int64_t, every) = 0;
  /// Also save after every `every_steps`-th training step (0: never): a run of one or two
  /// long epochs gets points to resume or branch from (mixtrain doctor --from). A step
  /// checkpoint resumes exactly as an epoch one does, mid-epoch included.
  TORCH_ARG(int64_t, every_steps) = 0;
  /// Keep the newest `keep` checkpoints (0: all).
  TORCH_ARG(int64_t, keep) = 0;
  /// When it becomes true (a signal handler sets it), save after the current
  /// training batch and end the fit. nullptr: never.
  TORCH_ARG(StopFlag, stop) = nullptr;
  /// Set to true once a stop request would be saved: at the end of the first
  /// training batch. Until then there is nothing a checkpoint would add, so a
  /// signal handler may end the process at once (a forward that never returns
  /// cannot hold a stop hostage). nullptr: not told.
  TORCH_ARG(ArmedFlag, armed) = nullptr;
  /// false: the same decisions without writing files (data-parallel ranks other than 0).
  TORCH_ARG(bool, write) = true;
};

/// Saves `dir/checkpoint-<step>.pt` (Learner::save) at the end of every `every`-th
/// epoch (0: never) and of the last one, keeps the newest `keep` (0: all), and
/// names the newest in `dir/latest` (written atomically, for people and older
/// versions: a resume takes the newest complete checkpoint, see latest()). When `*stop` becomes
/// true (a signal handler sets it), it saves after the current training batch
/// and ends the fit: interrupted() then says so. Order 90: after the Recorder
/// and the loggers have seen the batch or epoch.
class Checkpointer : public Callback {
 public:
  explicit Checkpointer(CheckpointerOptions options);
  std::string name() const override { return "Checkpointer"; }

  /// Whether the fit ended because `*stop` was set.
  bool interrupted() const { return interrupted_; }
  /// The last checkpoint written ("" before the first).
  const std::string& last_path() const { return last_path_; }
  /// The newest complete checkpoint of a run directory (the highest step), or ""
  /// when there is none. Every checkpoint-<step>.pt is complete (written to a temp
  /// file, then renamed), so this holds whatever `latest` says: a run killed after
  /// a checkpoint landed but before `latest` was replaced resumes from that
  /// checkpoint. `latest` itself is never followed, so a `latest` naming a file
  /// elsewhere, or a huge one, changes nothing.
  static std::string latest(const std::string& dir);
  /// Every complete checkpoint in `dir`, newest (highest step) first.
  static std::vector<std::string> newest_first(const std::string& dir);
  /// Whether `dir` holds a complete checkpoint (a temp file of a killed writer is none).
  static bool holds_checkpoints(const std::string& dir);
  /// Removes the temp files (NAME.tmp.PID) of writers that are no longer running;
  /// returns how many went.
  static int remove_dead_temp_files(const std::string& dir);

  /// Saves a checkpoint now (between batches, or before a step) and returns its
  /// path ("" when this Checkpointer does not write).
  std::string save(Learner& learn);

  void after_batch(Learner& learn) override;
  void after_epoch(Learner& learn) override;

 private:
  CheckpointerOptions options_;
  bool interrupted_ = false;
  std::string last_path_;
};

} // namespace mixtrain::callbacks
