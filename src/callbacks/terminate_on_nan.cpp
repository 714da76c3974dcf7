#include "mixtrain/callbacks/terminate_on_nan.h"

#include "mixtrain/core/precision_callback.h"
#include "mixtrain/core/learner.h"

#include <cmath>

namespace mixtrain::callbacks {

TerminateOnNaN::TerminateOnNaN(int64_t max_bad_steps, std::shared_ptr<Checkpointer> checkpointer)
    : max_bad_steps_(max_bad_steps), checkpointer_(std::move(checkpointer)) {
  TORCH_CHECK(max_bad_steps >= 0, "Invalid max_bad_steps: ", max_bad_steps, " (must be >= 0)");
  order = 20;
}

void TerminateOnNaN::before_fit(Learner&) {
  bad_in_a_row_ = 0;
  triggered_ = false;
  message_.clear();
}

namespace {
bool loss_scaled(Learner& learn) {
  auto pc = learn.precision_cb();
  return pc && pc->loss_scaled();
}
} // namespace

// Without loss scaling the first bad loss stops the run before its backward and
// step. With it, a bad loss's step is skipped by the scaler, so the loss is
// judged after the step: the scaler has read it with found_inf in the step's one
// device-to-host transfer (Learner::loss_value).
void TerminateOnNaN::after_loss(Learner& learn) {
  if (learn.training() && !loss_scaled(learn)) judge(learn, false);
}

void TerminateOnNaN::after_batch(Learner& learn) {
  if (learn.training() && loss_scaled(learn)) judge(learn, true);
}

void TerminateOnNaN::judge(Learner& learn, bool scaled) {
  const double loss = learn.loss_value();
  if (std::isfinite(loss)) {
    bad_in_a_row_ = 0;
    return;
  }
  ++bad_in_a_row_;
  if (scaled && bad_in_a_row_ <= max_bad_steps_) return;  // the scaler skipped this step

  // Stop. The weights are the last good ones only if they are finite: a step
  // may already have made them inf/NaN. Buffers (BatchNorm's running statistics)
  // are told apart: non-finite inputs reach them in the forward, with every
  // parameter still finite.
  triggered_ = true;
  const auto nonfinite = [](const torch::Tensor& t) {
    return t.defined() && t.is_floating_point() && !torch::isfinite(t).all().item<bool>();
  };
  bool params_finite = true;
  std::string bad_buffers;
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : learn.model().module().parameters()) params_finite = params_finite && !nonfinite(p);
    for (const auto& kv : learn.model().module().named_buffers())
      if (nonfinite(kv.value())) bad_buffers += (bad_buffers.empty() ? "" : ", ") + kv.key();
  }
  bool inputs_finite = true;
  for (const auto& x : learn.batch().inputs()) inputs_finite = inputs_finite && !nonfinite(x);
  const std::string buffers_note =
      bad_buffers.empty() ? "" : "; the buffers " + bad_buffers + " are not" +
                                     (inputs_finite ? "" : " (the batch's non-finite inputs reached them)");
  std::string where = "no checkpoint written (no run directory)";
  if (checkpointer_) {
    const std::string path = checkpointer_->save(learn);
    const std::string kept = holder_.empty() ? "saved to " + path : "held by " + holder_;
    const std::string for_inspection =
        holder_.empty() ? "saved, for inspection only, to " + path : "held by " + holder_ + ", for inspection only";
    where = params_finite && bad_buffers.empty() ? "last good state " + kept
            : params_finite                       ? "the parameters are finite" + buffers_note + "; that state " + kept
                            : "the weights are already non-finite (an earlier step made them so); that state " + for_inspection;
  }
  if (!inputs_finite)
    message_ = "the loss became " + std::string(std::isnan(loss) ? "NaN" : "inf") + " at step " +
               std::to_string(learn.train_iter()) + ": this batch's inputs hold NaN/inf; " + where +
               ". Clean or impute the data (the run said how many values before it started)";
  else if (scaled)
    message_ = "the loss was NaN/inf for " + std::to_string(bad_in_a_row_) +
               " consecutive steps despite loss scaling (at step " + std::to_string(learn.train_iter()) + "); " +
               where + ". The fp16 forward pass likely overflows (> 65504): normalize the inputs, find the "
               "overflowing op (mixtrain doctor), or train in bf16/fp32";
  else
    message_ = "the loss became " + std::string(std::isnan(loss) ? "NaN" : "inf") + " at step " +
               std::to_string(learn.train_iter()) + "; " + where +
               ". Check the data for NaN/inf and unnormalized inputs, then lower the learning rate";
  throw CancelFitException();
}

} // namespace mixtrain::callbacks
