#include "mixtrain/amp/mixed_precision.h"

#include "mixtrain/core/learner.h"
#include "mixtrain/compat.h"
#include "mixtrain/util/option_error.h"

#include "util/archive_util.h"

#include <algorithm>
#include <iostream>
#include <mutex>
#include <set>
#include <stdexcept>

namespace mixtrain::amp {

namespace {
GradScalerOptions scaler_options_for(c10::ScalarType dtype, GradScalerOptions options) {
  // bf16 has fp32's exponent range: no loss scaling (fastai's to_bf16).
  if (dtype == c10::ScalarType::BFloat16) options.enabled(false);
  return options;
}
} // namespace

// The autocast mode of its dtype, from the table (a scaler over an fp32 model is fp32).
Precision MixedPrecision::precision() const { return precision_for(dtype_, /*master_weights=*/false); }

MixedPrecision::MixedPrecision(c10::ScalarType dtype, GradScalerOptions scaler_options, bool allow_fp16_emulation)
    : dtype_(dtype), scaler_(scaler_options_for(dtype, scaler_options)), allow_fp16_emulation_(allow_fp16_emulation) {
  TORCH_CHECK(dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Float,
              "MixedPrecision: dtype must be Half, BFloat16 or Float, got ", dtype);
  order = 10;
}

namespace {
/// Prints `message` to stderr once per process per call site.
void notice_once(bool& printed, const char* message) {
  if (!printed) std::cerr << "mixtrain: notice: " << message << std::endl;
  printed = true;
}
} // namespace

bool check_precision_supported(c10::ScalarType dtype, c10::Device where, bool allow_fp16_emulation, bool notice) {
  const c10::DeviceType device = where.type();
  if (dtype == c10::ScalarType::BFloat16) {
    if (device == c10::DeviceType::CUDA && !compat::cuda_bf16_supported(where.has_index() ? where.index() : -1))
      throw std::invalid_argument("Unsupported GPU for bfloat16 mixed precision training");
    // Without bf16 units, libtorch's CPU bf16 autocast is 5-40x slower than fp32:
    // bf16 numerics are emulated instead (round through bfloat16, compute in fp32).
    if (device == c10::DeviceType::CPU && !compat::cpu_has_native_bf16()) {
      static bool bf16_emulation_noticed = false;
      if (notice)
        notice_once(bf16_emulation_noticed,
                  "this CPU has no native bf16 instructions: bf16 numerics are emulated (rounded through bfloat16, "
                  "computed in fp32), near fp32 speed; real bf16 autocast would be 5-40x slower");
      return true;
    }
  }
  if (dtype != c10::ScalarType::Half || device != c10::DeviceType::CPU) return false;
  if (!allow_fp16_emulation)
    throw OptionError("no_emulation", "fp16 mixed precision needs CUDA, and fp16 emulation on CPU is forbidden (" +
                                          Phrase::setting("no_emulation", "true") + "); use bf16 (real CPU autocast), fp32, "
                                          "or allow emulation");
  static bool emulation_noticed = false;
  if (notice) notice_once(emulation_noticed, "fp16 numerics are emulated on CPU (no speed-up; for checking fp16 safety)");
  return true;
}

void MixedPrecision::prepare_for(Learner& learn) {
  // Decided once per device: before_validate asks again at every epoch of a fit.
  if (prepared_for_ == learn.device()) return;
  emulated_ = check_precision_supported(dtype_, learn.device(), allow_fp16_emulation_) ||
              (fell_back_at_ >= 0 && learn.device().is_cpu());

  device_type_ = learn.device().type();
  prepared_for_ = learn.device();
}

void MixedPrecision::before_fit(Learner& learn) { prepare_for(learn); }

// validate() and get_preds() outside a fit (right after load, say) run the
// forward pass the way training does: emulated fp16 on a CPU.
void MixedPrecision::before_validate(Learner& learn) { prepare_for(learn); }

std::string MixedPrecision::mode_tag() const { return std::string("mixed_precision:") + c10::toString(dtype_); }

void MixedPrecision::before_batch(Learner& learn) {
  if (!keep_fp32_.empty() && dtype_ != c10::ScalarType::Float) {
    if (!island_params_) island_params_ = std::make_shared<const IslandParams>(island_params(keep_fp32_, learn.model().module()));
    islands_.emplace(keep_fp32_, island_params_);
  }
  if (emulated_)
    emulation_.emplace(dtype_);
  else if (dtype_ != c10::ScalarType::Float)
    guard_.emplace(device_type_, dtype_);
}

bool MixedPrecision::retry_forward_emulated(Learner& learn, const std::function<void()>& forward, const std::string& failure) {
  if (emulated_ || !guard_ || dtype_ != c10::ScalarType::BFloat16 || device_type_ != c10::DeviceType::CPU) return false;
  guard_.reset();
  emulation_.emplace(dtype_);
  try {
    forward();
  } catch (const std::exception&) {  // not a gap of the real path: the caller reports the first failure
    emulation_.reset();
    guard_.emplace(device_type_, dtype_);
    return false;
  }
  emulated_ = true;
  fell_back_at_ = learn.train_iter();
  // Once per process and failure: the doctor's runs of one model meet it in each run.
  static std::mutex noticed_mutex;  // runs may train in several threads (Python)
  static std::set<std::string> noticed;
  const std::lock_guard<std::mutex> lock(noticed_mutex);
  if (noticed.insert(failure).second)
    std::cerr << "mixtrain: notice: real CPU bf16 autocast cannot run this model (" << failure
              << "); bf16 numerics are emulated from here on (rounded through bfloat16, computed in fp32: "
                 "bf16's results without its speed-up)"
              << std::endl;
  return true;
}

void MixedPrecision::end_forward_region() {
  guard_.reset();
  emulation_.reset();
  islands_.reset();
}

void MixedPrecision::after_pred(Learner& learn) {
  // fastai's to_float: the loss is computed in fp32.
  torch::Tensor& pred = learn.pred();
  if (pred.defined() && pred.is_floating_point() && pred.scalar_type() != torch::kFloat) pred = pred.to(torch::kFloat);
}

void MixedPrecision::after_loss(Learner&) { end_forward_region(); }

void MixedPrecision::before_backward(Learner& learn) {
  if (scaler_.is_enabled()) learn.loss_grad() = scaler_.scale(learn.loss_grad());
}

void MixedPrecision::before_step(Learner& learn) {
  if (!scaler_.is_enabled()) return;
  const double scale_used = scaler_.get_scale();
  // found_inf and the loss in the step's one device-to-host transfer: the log and the NaN stop use it.
  std::vector<double> loss;
  const bool step = scaler_.prepare_step(learn.opt(), {learn.loss()}, loss);
  learn.provide_loss_value(loss.at(0));
  step_attempted_ = true;
  learn.step_info().scale = scale_used;
  learn.step_info().skipped = !step;
  if (!step) throw CancelStepException();
}

void MixedPrecision::after_step(Learner&) {
  // Runs after a completed and after a cancelled step (fastai's after_step).
  if (step_attempted_) scaler_.update();
  step_attempted_ = false;
}

void MixedPrecision::after_batch(Learner&) { end_forward_region(); }
void MixedPrecision::after_cancel_batch(Learner&) { end_forward_region(); }

void MixedPrecision::save_state(torch::serialize::OutputArchive& ar) const {
  // The islands are part of the mode: a checkpoint restores them.
  c10::List<std::string> islands;
  for (const auto& p : keep_fp32_) islands.push_back(p);
  ar.write("keep_fp32", c10::IValue(islands));
  // A run that fell back to the emulation resumes emulated, as it went on (-1: it never fell back).
  mixtrain::detail::write_i64(ar, "fell_back_at", fell_back_at_);
  for (const auto& kv : scaler_.state_dict()) {
    const c10::IValue& v = kv.value();
    mixtrain::detail::write_f64(ar, "scaler." + kv.key().toStringRef(),
                                v.isInt() ? static_cast<double>(v.toInt()) : v.toDouble());
  }
}

void MixedPrecision::load_state(torch::serialize::InputArchive& ar) {
  c10::IValue islands;
  if (ar.try_read("keep_fp32", islands) && islands.isList()) {  // older checkpoints have none
    std::vector<std::string> patterns;
    for (const auto& p : islands.toListRef()) patterns.push_back(p.toStringRef());
    keep_fp32(std::move(patterns));
  }
  torch::Tensor fell_back_at;
  if (ar.try_read("fell_back_at", fell_back_at)) {  // older checkpoints have none
    fell_back_at_ = fell_back_at.item<int64_t>();
    prepared_for_.reset();  // emulated_ is decided again, with the fallback
  }
  if (scaler_.is_enabled()) {
    GradScalerState state = empty_grad_scaler_state();
    for (const char* key : {"scale", "growth_factor", "backoff_factor"})
      state.insert(key, mixtrain::detail::read_f64(ar, std::string("scaler.") + key));
    for (const char* key : {"growth_interval", "_growth_tracker", "_hysteresis_tracker"})
      state.insert(key, static_cast<int64_t>(mixtrain::detail::read_f64(ar, std::string("scaler.") + key)));
    scaler_.load_state_dict(state);
  }
}

void MixedPrecision::on_error(Learner&) {
  end_forward_region();  // autocast / emulation off again for the caller's thread
  step_attempted_ = false;
}

void MixedPrecision::after_fit(Learner&) {
  end_forward_region();
  step_attempted_ = false;
}

} // namespace mixtrain::amp
