#pragma once
/// MixedPrecision: fastai v2's mixed-precision callback (autocast + GradScaler),
/// without fastai's silences: every step's scale and skip is recorded and kept.

#include "mixtrain/amp/autocast.h"
#include "mixtrain/amp/grad_scaler.h"
#include "mixtrain/callback.h"

#include <memory>
#include <optional>
#include <vector>

namespace mixtrain::amp {

/// Throws when `dtype` mixed precision cannot run on `device`: bf16 on a CUDA GPU
/// without bf16 (std::invalid_argument, fastai's message), or fp16 on CPU
/// (not available in this build). Prints the one-time slow-bf16 notice on CPUs
/// without native bf16.
void check_precision_supported(c10::ScalarType dtype, c10::DeviceType device);

/// Runs the forward pass and the loss under autocast (before_batch to
/// after_loss), casts floating-point predictions to fp32 (after_pred), scales
/// the loss (before_backward; the logged loss stays unscaled), unscales and
/// checks the gradients (before_step) and cancels the optimizer step on
/// inf/NaN, then updates the scale (after_step, also after a cancelled step).
///
/// dtype kHalf uses a GradScaler; kBFloat16 has fp32's range and uses none
/// (as fastai). kFloat disables autocast and keeps the scaler: fp32 with loss
/// scaling, useful to measure the scaler's cost or to test skip handling.
/// Order 10, as in fastai. Learner::to_fp16 / to_bf16 attach it.
class MixedPrecision : public Callback {
 public:
  explicit MixedPrecision(c10::ScalarType dtype = c10::ScalarType::Half, GradScalerOptions scaler_options = {});
  std::string name() const override { return "MixedPrecision"; }

  c10::ScalarType dtype() const { return dtype_; }
  /// The scaler (disabled for bf16).
  GradScaler& scaler() { return scaler_; }
  /// Scale used at every attempted optimizer step, skipped ones included; kept after fit.
  const std::vector<double>& scales() const { return scales_; }
  /// Whether each step in scales() was skipped for inf/NaN gradients.
  const std::vector<bool>& skipped() const { return skipped_; }
  /// Steps skipped so far.
  int64_t skipped_steps() const;

  void before_fit(Learner& learn) override;
  void before_batch(Learner& learn) override;
  void after_pred(Learner& learn) override;
  void after_loss(Learner& learn) override;
  void before_backward(Learner& learn) override;
  void before_step(Learner& learn) override;
  void after_step(Learner& learn) override;
  void after_batch(Learner& learn) override;
  void after_cancel_batch(Learner& learn) override;
  void after_fit(Learner& learn) override;

 private:
  c10::ScalarType dtype_;
  GradScaler scaler_;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
  std::optional<autocast> guard_;
  bool step_attempted_ = false;
  std::vector<double> scales_;
  std::vector<bool> skipped_;
};

} // namespace mixtrain::amp
