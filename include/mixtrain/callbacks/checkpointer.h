#pragma once
/// Periodic and on-interrupt checkpoints in a run directory.

#include "mixtrain/callback.h"

#include <atomic>
#include <cstdint>
#include <string>

namespace mixtrain::callbacks {

/// Saves `dir/checkpoint-<step>.pt` (Learner::save) at the end of every `every`-th
/// epoch (0: never) and of the last one, keeps the newest `keep` (0: all), and
/// names the newest in `dir/latest` (written atomically). When `*stop` becomes
/// true (a signal handler sets it), it saves after the current training batch
/// and ends the fit: interrupted() then says so. Order 90: after the Recorder
/// and the loggers have seen the batch or epoch.
class Checkpointer : public Callback {
 public:
  /// `write` false: the same decisions (stop after the batch on `*stop`) without
  /// writing files, for data-parallel ranks other than 0.
  Checkpointer(std::string dir, int64_t every, int64_t keep = 0, const std::atomic<bool>* stop = nullptr,
               bool write = true);
  std::string name() const override { return "Checkpointer"; }

  /// Whether the fit ended because `*stop` was set.
  bool interrupted() const { return interrupted_; }
  /// The last checkpoint written ("" before the first).
  const std::string& last_path() const { return last_path_; }
  /// The newest checkpoint of a run directory (from `dir/latest`), or "" when there is none.
  static std::string latest(const std::string& dir);

  /// Saves a checkpoint now (between batches, or before a step) and returns its
  /// path ("" when this Checkpointer does not write).
  std::string save(Learner& learn);

  void after_batch(Learner& learn) override;
  void after_epoch(Learner& learn) override;

 private:
  std::string dir_;
  int64_t every_, keep_;
  const std::atomic<bool>* stop_;
  bool write_;
  bool interrupted_ = false;
  std::string last_path_;
};

} // namespace mixtrain::callbacks
