#include "mixtrain/amp/mixed_precision.h"

#include "mixtrain/learner.h"

#include <algorithm>
#include <iostream>
#include <stdexcept>

namespace mixtrain::amp {

namespace {
GradScalerOptions scaler_options_for(c10::ScalarType dtype, GradScalerOptions options) {
  // bf16 has fp32's exponent range: no loss scaling (fastai's to_bf16).
  if (dtype == c10::ScalarType::BFloat16) options.enabled(false);
  return options;
}
} // namespace

MixedPrecision::MixedPrecision(c10::ScalarType dtype, GradScalerOptions scaler_options)
    : dtype_(dtype), scaler_(scaler_options_for(dtype, scaler_options)) {
  TORCH_CHECK(dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Float,
              "MixedPrecision: dtype must be Half, BFloat16 or Float, got ", dtype);
  order = 10;
}

int64_t MixedPrecision::skipped_steps() const { return std::count(skipped_.begin(), skipped_.end(), true); }

void check_precision_supported(c10::ScalarType dtype, c10::DeviceType device) {
  if (dtype == c10::ScalarType::BFloat16) {
    if (device == c10::DeviceType::CUDA && !compat::cuda_bf16_supported())
      throw std::invalid_argument("Unsupported GPU for bfloat16 mixed precision training");
    if (device == c10::DeviceType::CPU && !compat::cpu_has_native_bf16()) {
      static bool noticed = false;  // one notice per process
      if (!noticed)
        std::cerr << "mixtrain: notice: this CPU has no native bf16 instructions; bf16 autocast trains "
                     "correctly but 5-40x slower than fp32" << std::endl;
      noticed = true;
    }
  }
  TORCH_CHECK(!(dtype == c10::ScalarType::Half && device == c10::DeviceType::CPU),
              "fp16 mixed precision on CPU needs fp16 emulation, which this build does not have yet; "
              "use bf16 (real CPU autocast) or fp32");
}

void MixedPrecision::before_fit(Learner& learn) {
  device_type_ = learn.device().type();
  check_precision_supported(dtype_, device_type_);
}

void MixedPrecision::before_batch(Learner&) {
  if (dtype_ != c10::ScalarType::Float) guard_.emplace(device_type_, dtype_);
}

void MixedPrecision::after_pred(Learner& learn) {
  // fastai's to_float: the loss is computed in fp32.
  torch::Tensor& pred = learn.pred();
  if (pred.defined() && pred.is_floating_point() && pred.scalar_type() != torch::kFloat) pred = pred.to(torch::kFloat);
}

void MixedPrecision::after_loss(Learner&) { guard_.reset(); }

void MixedPrecision::before_backward(Learner& learn) {
  if (scaler_.is_enabled()) learn.loss_grad() = scaler_.scale(learn.loss_grad());
}

void MixedPrecision::before_step(Learner& learn) {
  if (!scaler_.is_enabled()) return;
  const double scale_used = scaler_.get_scale();
  const bool step = scaler_.prepare_step(learn.opt());
  step_attempted_ = true;
  scales_.push_back(scale_used);
  skipped_.push_back(!step);
  learn.step_info().scale = scale_used;
  learn.step_info().skipped = !step;
  if (!step) throw CancelStepException();
}

void MixedPrecision::after_step(Learner&) {
  // Runs after a completed and after a cancelled step (fastai's after_step).
  if (step_attempted_) scaler_.update();
  step_attempted_ = false;
}

void MixedPrecision::after_batch(Learner&) { guard_.reset(); }
void MixedPrecision::after_cancel_batch(Learner&) { guard_.reset(); }

void MixedPrecision::after_fit(Learner&) {
  guard_.reset();
  step_attempted_ = false;
}

} // namespace mixtrain::amp

namespace mixtrain {

Learner& Learner::to_fp16(amp::GradScalerOptions scaler_options) {
  to_fp32();
  add_cb(std::make_shared<amp::MixedPrecision>(c10::ScalarType::Half, scaler_options));
  return *this;
}

Learner& Learner::to_bf16() {
  to_fp32();
  add_cb(std::make_shared<amp::MixedPrecision>(c10::ScalarType::BFloat16));
  return *this;
}

Learner& Learner::to_fp32() {
  while (auto mp = get_cb<amp::MixedPrecision>()) remove_cb(mp);
  return *this;
}

std::shared_ptr<amp::MixedPrecision> Learner::mixed_precision() const { return get_cb<amp::MixedPrecision>(); }

} // namespace mixtrain
