#pragma once
/// MixedPrecision: fastai v2's mixed-precision callback (autocast + GradScaler),
/// without fastai's silences: every step's scale and skip goes to the Recorder and is kept.

#include "mixtrain/amp/autocast.h"
#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/amp/reduced_precision_emulation.h"
#include "mixtrain/amp/grad_scaler.h"
#include "mixtrain/core/precision_callback.h"

#include <memory>
#include <optional>
#include <string>

namespace mixtrain::amp {

/// Throws when `dtype` mixed precision cannot run on `device`: bf16 on a CUDA GPU
/// without bf16 (std::invalid_argument, fastai's message), or fp16 on CPU when
/// emulation is forbidden (c10::Error). Prints (with `notice`) the one-time notices: fp16 emulated on CPU,
/// bf16 emulated on a CPU without native bf16 instructions.
/// Returns true when the precision will be emulated (fp16 on CPU; bf16 on a CPU
/// without avx512_bf16/amx_bf16, where libtorch's bf16 autocast is 5-40x slower).
bool check_precision_supported(c10::ScalarType dtype, c10::Device device, bool allow_fp16_emulation = true,
                               bool notice = true);

/// Runs the forward pass and the loss under autocast (before_batch to
/// after_loss), casts floating-point predictions to fp32 (after_pred), scales
/// the loss (before_backward; the logged loss stays unscaled), unscales and
/// checks the gradients (before_step) and cancels the optimizer step on
/// inf/NaN, then updates the scale (after_step, also after a cancelled step).
///
/// dtype kHalf uses a GradScaler; kBFloat16 has fp32's range and uses none
/// (as fastai). kFloat disables autocast and keeps the scaler: fp32 with loss
/// scaling, useful to measure the scaler's cost or to test skip handling.
/// fp16 on CPU is emulated (amp/reduced_precision_emulation.h) unless `allow_fp16_emulation`
/// is false, which makes it an error at fit.
/// Every attempted step's scale and skip is written to the Learner's StepInfo,
/// so the Recorder holds the history.
/// Order 10, as in fastai. Learner::to_fp16 / to_bf16 attach it.
class MixedPrecision : public PrecisionCallback {
 public:
  explicit MixedPrecision(c10::ScalarType dtype = c10::ScalarType::Half, GradScalerOptions scaler_options = {},
                          bool allow_fp16_emulation = true);
  std::string name() const override { return "MixedPrecision"; }

  /// kFp16 or kBf16 (kFp32 for a scaler over an fp32 model).
  Precision precision() const override;
  c10::ScalarType dtype() const override { return dtype_; }
  /// Whether the last fit emulated fp16 numerics (fp16 on CPU).
  bool emulated() const override { return emulated_; }
  /// Real CPU bf16 autocast only: the failed forward runs again under the bf16
  /// emulation, which stays on for this callback's life when it succeeds.
  bool retry_forward_emulated(Learner& learn, const std::function<void()>& forward, const std::string& failure) override;
  bool loss_scaled() const override { return scaler_.is_enabled(); }
  double loss_scale() const override { return scaler_.get_scale(); }
  void set_found_inf_reducer(std::function<void(torch::Tensor& flag)> reduce) override {
    scaler_.set_found_inf_reducer(std::move(reduce));
  }
  GradScaler* grad_scaler() override { return scaler_.is_enabled() ? &scaler_ : nullptr; }
  torch::Tensor scale_extra_loss(const torch::Tensor& loss) override {
    return scaler_.is_enabled() ? scaler_.scale(loss) : loss;
  }
  bool step_extra_optimizer(torch::optim::Optimizer& optimizer) override {
    return scaler_.is_enabled() ? scaler_.step(optimizer) : PrecisionCallback::step_extra_optimizer(optimizer);
  }
  std::string mode_tag() const override;
  /// The scaler (disabled for bf16).
  GradScaler& scaler() { return scaler_; }
  /// Keeps the modules matching `patterns` in fp32 (mixtrain/amp/fp32_islands.h),
  /// under emulated and real autocast alike.
  MixedPrecision& keep_fp32(std::vector<std::string> patterns) {
    keep_fp32_ = std::move(patterns);
    island_params_.reset();
    prepared_for_.reset();
    return *this;
  }
  std::vector<std::string> keep_fp32() const override { return keep_fp32_; }

  /// Checkpoints carry the scaler's state.
  std::string state_key() const override { return "mixed_precision"; }
  void save_state(torch::serialize::OutputArchive& ar) const override;
  void load_state(torch::serialize::InputArchive& ar) override;

  void before_fit(Learner& learn) override;
  void before_validate(Learner& learn) override;
  void before_batch(Learner& learn) override;
  void after_pred(Learner& learn) override;
  void after_loss(Learner& learn) override;
  void before_backward(Learner& learn) override;
  void before_step(Learner& learn) override;
  void after_step(Learner& learn) override;
  void after_batch(Learner& learn) override;
  void after_cancel_batch(Learner& learn) override;
  void after_fit(Learner& learn) override;
  void on_error(Learner& learn) override;

 private:
  /// Closes autocast / emulation (after the loss, and on any exit from a batch).
  void end_forward_region();
  /// Decides from the Learner's device whether fp16 is emulated (or refused).
  void prepare_for(Learner& learn);

  c10::ScalarType dtype_;
  GradScaler scaler_;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
  bool allow_fp16_emulation_;
  bool emulated_ = false;
  int64_t fell_back_at_ = -1;  // the step at which real CPU bf16 could not run the model: emulated from then on
  std::optional<c10::Device> prepared_for_;  // the device emulated_ was decided for
  std::optional<autocast> guard_;
  std::vector<std::string> keep_fp32_;
  std::optional<Fp32Islands> islands_;
  std::shared_ptr<const IslandParams> island_params_;  // worked out at the first batch, not every batch
  std::optional<ReducedPrecisionEmulation> emulation_;
  bool step_attempted_ = false;
};

} // namespace mixtrain::amp
