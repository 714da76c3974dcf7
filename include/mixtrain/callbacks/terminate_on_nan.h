#pragma once
/// Stops a run whose loss became NaN or inf, saving the state it stopped in and
/// saying whether those weights are still good.

#include "mixtrain/core/callback.h"
#include "mixtrain/callbacks/checkpointer.h"

#include <cstdint>
#include <memory>
#include <string>

namespace mixtrain::callbacks {

/// fastai's TerminateOnNaN, but it saves the state and says why.
/// Without loss scaling (fp32, bf16) the first non-finite training loss stops
/// the fit. With loss scaling (fp16 GradScaler, master weights) the scaler
/// handles overflow by skipping steps, so only more than `max_bad_steps`
/// consecutive non-finite losses stop it. When it stops, it saves a checkpoint
/// through `checkpointer` (if given) *before* that batch's step and ends the fit;
/// triggered() and message() tell the caller. The message says which kind of
/// state that is: the last good weights when every weight is finite (the loss
/// overflowed in the forward pass: bad data, fp16 range), or weights that an
/// earlier step already made non-finite (kept for inspection; resuming from them
/// cannot help). Order 20: after the precision callbacks (10) have cast the loss.
class TerminateOnNaN : public Callback {
 public:
  explicit TerminateOnNaN(int64_t max_bad_steps = 10, std::shared_ptr<Checkpointer> checkpointer = nullptr);
  std::string name() const override { return "TerminateOnNaN"; }

  /// Where the message says the stopped state is when the checkpoint's folder is not the
  /// caller's to keep (a front end's temporary folder): "held by <holder>" instead of the
  /// checkpoint's path.
  void hold_state_in(std::string holder) { holder_ = std::move(holder); }

  bool triggered() const { return triggered_; }
  /// One line saying what happened, what was saved where, and what to try.
  const std::string& message() const { return message_; }

  void before_fit(Learner& learn) override;
  void after_loss(Learner& learn) override;
  void after_batch(Learner& learn) override;

 private:
  void judge(Learner& learn, bool scaled);
  int64_t max_bad_steps_;
  std::shared_ptr<Checkpointer> checkpointer_;
  std::string holder_;
  int64_t bad_in_a_row_ = 0;
  bool triggered_ = false;
  std::string message_;
};

} // namespace mixtrain::callbacks
