#pragma once
/// Callbacks: the only way to change what the training loop does.
///
/// The events and their order follow fastai's Learner exactly:
///
///   before_fit
///     before_epoch
///       before_train
///         before_batch, after_pred, after_loss,
///         before_backward, after_backward, before_step, after_step,
///         after_batch                               (repeated per batch)
///       after_train
///       before_validate
///         before_batch, after_pred, after_loss, after_batch   (no grad)
///       after_validate
///     after_epoch
///   after_fit
///
/// Throwing a Cancel*Exception from any hook skips the rest of that stage,
/// fires `after_cancel_<stage>` and then still fires `after_<stage>`.

#include <exception>
#include <memory>
#include <string>

namespace torch::serialize {
class InputArchive;
class OutputArchive;
} // namespace torch::serialize

namespace mixtrain {

class Learner;

/// Every event a Learner fires, in declaration order of fastai's `_events`.
enum class Event {
  before_fit, before_epoch, before_train, before_batch, after_pred, after_loss,
  before_backward, after_backward, before_step, after_step,
  after_cancel_batch, after_batch, after_cancel_backward, after_cancel_step,
  after_cancel_train, after_train, before_validate, after_cancel_validate,
  after_validate, after_cancel_epoch, after_epoch, after_cancel_fit, after_fit,
};

/// The event's name as fastai spells it ("before_fit", ...).
const char* event_name(Event event);

/// Control flow inside the loop, as fastai's Cancel*Exception.
struct CancelException : std::exception {};
/// Skips the rest of the current batch.
struct CancelBatchException : CancelException {
  const char* what() const noexcept override { return "CancelBatchException"; }
};
/// Skips backward, step and zero_grad of the current batch.
struct CancelBackwardException : CancelException {
  const char* what() const noexcept override { return "CancelBackwardException"; }
};
/// Skips the optimizer step of the current batch (zero_grad still runs).
struct CancelStepException : CancelException {
  const char* what() const noexcept override { return "CancelStepException"; }
};
/// Skips the rest of the training phase of the current epoch.
struct CancelTrainException : CancelException {
  const char* what() const noexcept override { return "CancelTrainException"; }
};
/// Skips the rest of the validation phase of the current epoch.
struct CancelValidateException : CancelException {
  const char* what() const noexcept override { return "CancelValidateException"; }
};
/// Skips the rest of the current epoch.
struct CancelEpochException : CancelException {
  const char* what() const noexcept override { return "CancelEpochException"; }
};
/// Ends fit.
struct CancelFitException : CancelException {
  const char* what() const noexcept override { return "CancelFitException"; }
};

/// Base class for callbacks. Every hook is a no-op; override the ones you need.
/// Callbacks run in ascending `order` (ties: the order they were added).
///
/// Example:
///   struct StopAfter : mixtrain::Callback {
///     int64_t n; explicit StopAfter(int64_t n) : n(n) {}
///     void after_batch(Learner& l) override { if (l.train_iter() >= n) throw CancelFitException(); }
///   };
class Callback {
 public:
  virtual ~Callback() = default;

  /// Lower runs first. Recorder is 50, progress output 60 (as in fastai).
  int order = 0;

  /// A name for listings and errors.
  virtual std::string name() const { return "Callback"; }

  /// Key under which Learner::save stores this callback's state; empty for
  /// stateless callbacks (the default). A checkpoint holding a key that the
  /// loading Learner has no callback for, or the reverse, is a mismatch.
  virtual std::string state_key() const { return ""; }
  /// Writes what an exact resume needs (called by Learner::save).
  virtual void save_state(torch::serialize::OutputArchive&) const {}
  /// Throws, naming the mismatch, when the saved state cannot continue in this
  /// callback. Learner::load calls it for every callback before it changes
  /// anything, so a refused checkpoint leaves the Learner as it was.
  virtual void check_state(torch::serialize::InputArchive&) const {}
  /// Restores it (called by Learner::load).
  virtual void load_state(torch::serialize::InputArchive&) {}

  /// Routes an event to its hook. Override to observe every event at once.
  virtual void handle(Event event, Learner& learn);

  /// Not a fastai event: called when fit, validate or get_preds ends with an
  /// exception that is not a cancel (a model that throws, an out-of-memory), before
  /// it reaches the caller. A callback releases here what it holds open across
  /// events (an autocast region, fp16 emulation), since no after_ event will come.
  virtual void on_error(Learner&) {}

  virtual void before_fit(Learner&) {}
  virtual void before_epoch(Learner&) {}
  virtual void before_train(Learner&) {}
  virtual void before_batch(Learner&) {}
  virtual void after_pred(Learner&) {}
  virtual void after_loss(Learner&) {}
  virtual void before_backward(Learner&) {}
  virtual void after_backward(Learner&) {}
  virtual void before_step(Learner&) {}
  virtual void after_step(Learner&) {}
  virtual void after_cancel_batch(Learner&) {}
  virtual void after_batch(Learner&) {}
  virtual void after_cancel_backward(Learner&) {}
  virtual void after_cancel_step(Learner&) {}
  virtual void after_cancel_train(Learner&) {}
  virtual void after_train(Learner&) {}
  virtual void before_validate(Learner&) {}
  virtual void after_cancel_validate(Learner&) {}
  virtual void after_validate(Learner&) {}
  virtual void after_cancel_epoch(Learner&) {}
  virtual void after_epoch(Learner&) {}
  virtual void after_cancel_fit(Learner&) {}
  virtual void after_fit(Learner&) {}
};

using CallbackPtr = std::shared_ptr<Callback>;

} // namespace mixtrain
