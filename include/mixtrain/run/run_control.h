#pragma once
/// What every run of the run layer shares with its front end, whatever it does (train,
/// lr_find, the doctor): the stop flags a front end's Ctrl-C sets, the callbacks that
/// make a Learner heed them, and the turn runs in one process take.
#include "mixtrain/core/learner.h"

#include <atomic>
#include <functional>

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

} // namespace mixtrain::run
