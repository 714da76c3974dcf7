#pragma once
/// StopOnRequest: ends a fit with StopRequested once a front end's stop flag is
/// set (Python's Ctrl-C), after the batch in flight, so the model holds the
/// weights of the last whole step. Training runs stop through the Checkpointer
/// instead (it saves first); this is for the runs that keep nothing: the doctor's
/// and lr_find's.
/// Header-only: each callback is a few lines, inlined where it is added.

#include "mixtrain/core/callback.h"

#include <atomic>
#include <functional>
#include <stdexcept>

namespace mixtrain::callbacks {

/// What a stopped fit throws; it passes through the doctor's trials (a stop is
/// not a failed trial) to the front end.
struct StopRequested : std::runtime_error {
  StopRequested() : std::runtime_error("stopped on request (Ctrl-C)") {}
};

class StopOnRequest : public Callback {
 public:
  explicit StopOnRequest(const std::atomic<bool>* requested) : requested_(requested) { order = 100; }  // after the batch is recorded
  void after_batch(Learner&) override {
    if (requested_ && requested_->load()) throw StopRequested();
  }

 private:
  const std::atomic<bool>* requested_;
};

/// Asks `poll` after each batch whether to stop, and raises `*requested` when it
/// says so: before the Checkpointer (90) and StopOnRequest (100) look at it.
class PollForStop : public Callback {
 public:
  PollForStop(std::function<bool()> poll, std::atomic<bool>* requested) : poll_(std::move(poll)), requested_(requested) {
    order = 85;
  }
  void after_batch(Learner&) override {
    if (poll_ && requested_ && poll_()) requested_->store(true);
  }

 private:
  std::function<bool()> poll_;
  std::atomic<bool>* requested_;
};

} // namespace mixtrain::callbacks
