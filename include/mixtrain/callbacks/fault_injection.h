#pragma once
/// Testing aids: callbacks that inject faults at chosen training steps, so that
/// the paths a user hopes never to see (an overflow, an interrupt, a crashed
/// rank) run deterministically in tests and behind the CLI's hidden flags.
/// Not for training.
/// Header-only: each callback is a few lines, inlined where it is added.

#include "mixtrain/core/callback.h"
#include "mixtrain/core/learner.h"

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>
#include <utility>

namespace mixtrain::testing {

/// Puts an inf into the first parameter's gradient after backward at the chosen
/// training steps (train_iter). Order 5: after DataParallel's all-reduce (1), so
/// only this process sees it, and before the scaler checks the gradients (10).
class InjectOverflow : public Callback {
 public:
  explicit InjectOverflow(std::function<bool(int64_t step)> at) : at_(std::move(at)) { order = 5; }
  explicit InjectOverflow(std::set<int64_t> steps)
      : InjectOverflow([steps = std::move(steps)](int64_t s) { return steps.count(s) > 0; }) {}
  std::string name() const override { return "testing::InjectOverflow"; }
  void after_backward(Learner& learn) override {
    if (at_(learn.train_iter()))
      learn.model().module().parameters()[0].grad().view(-1)[0] = std::numeric_limits<float>::infinity();
  }

 private:
  std::function<bool(int64_t)> at_;
};

/// Delivers a real SIGINT to this process after training step `step`, so the
/// interrupt path (checkpoint, exit 130) runs as a user's Ctrl-C would. Order 85:
/// before the Checkpointer (90) looks at the stop request.
class RaiseSigintAt : public Callback {
 public:
  explicit RaiseSigintAt(int64_t step) : step_(step) { order = 85; }
  std::string name() const override { return "testing::RaiseSigintAt"; }
  void after_batch(Learner& learn) override {
    if (learn.training() && learn.train_iter() == step_) std::raise(SIGINT);
  }

 private:
  int64_t step_;
};

/// Aborts the process after training step `step`, as a crashed rank would.
class AbortAt : public Callback {
 public:
  explicit AbortAt(int64_t step) : step_(step) {}
  std::string name() const override { return "testing::AbortAt"; }
  void after_batch(Learner& learn) override {
    if (learn.training() && learn.train_iter() == step_) std::abort();
  }

 private:
  int64_t step_;
};

} // namespace mixtrain::testing
