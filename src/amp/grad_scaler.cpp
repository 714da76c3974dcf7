#include "mixtrain/amp/grad_scaler.h"

#include "mixtrain/amp/unscale.h"

#include <torch/optim/optimizer.h>

#include <cmath>

namespace mixtrain::amp {

namespace {
/// torch keeps the scale as a float32 tensor: every new value is rounded to float.
double as_float(double v) { return static_cast<double>(static_cast<float>(v)); }
} // namespace

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(as_float(options.init_scale())), hysteresis_left_(options.hysteresis()) {
  const auto& o = options_;
  TORCH_CHECK(o.init_scale() > 0 && std::isfinite(o.init_scale()), "Invalid init_scale: ", o.init_scale(),
              " (must be > 0 and finite)");
  TORCH_CHECK(o.growth_factor() > 1, "Invalid growth_factor: ", o.growth_factor(), " (must be > 1)");
  TORCH_CHECK(o.backoff_factor() > 0 && o.backoff_factor() < 1, "Invalid backoff_factor: ", o.backoff_factor(),
              " (must be in (0, 1))");
  TORCH_CHECK(o.growth_interval() >= 1, "Invalid growth_interval: ", o.growth_interval(), " (must be >= 1)");
  TORCH_CHECK(o.min_scale() >= 0, "Invalid min_scale: ", o.min_scale(), " (must be >= 0)");
  TORCH_CHECK(o.max_scale() > 0, "Invalid max_scale: ", o.max_scale(), " (must be > 0)");
  TORCH_CHECK(o.min_scale() <= o.init_scale() && o.init_scale() <= o.max_scale(), "Invalid init_scale: ",
              o.init_scale(), " (must lie in [min_scale, max_scale] = [", o.min_scale(), ", ", o.max_scale(), "])");
  TORCH_CHECK(o.hysteresis() >= 1, "Invalid hysteresis: ", o.hysteresis(), " (must be >= 1)");
}

void GradScaler::ensure_scale(const torch::Device& device) {
  if (!scale_tensor_.defined() || scale_tensor_.device() != device)
    scale_tensor_ = torch::full({}, scale_, torch::TensorOptions().dtype(torch::kFloat).device(device));
}

void GradScaler::sync_scale_tensor() {
  // fill_ with a host scalar launches a kernel on CUDA; it does not synchronize.
  if (scale_tensor_.defined()) scale_tensor_.fill_(scale_);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!is_enabled()) return loss;
  ensure_scale(loss.device());
  return loss * scale_tensor_;
}

GradScaler::OptState& GradScaler::state_for(torch::optim::Optimizer& opt) { return per_opt_[&opt]; }

void GradScaler::unscale_(torch::optim::Optimizer& opt) {
  if (!is_enabled()) return;
  OptState& s = state_for(opt);
  TORCH_CHECK(s.stage != Stage::kUnscaled, "unscale_() has already been called on this optimizer since the last update().");
  TORCH_CHECK(s.stage != Stage::kStepped, "unscale_() is being called after step().");

  std::vector<torch::Tensor> grads;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) grads.push_back(p.grad());  // a parameter without a gradient is ignored
  for (const auto& g : grads)
    TORCH_CHECK(g.scalar_type() != torch::kHalf, "Attempting to unscale FP16 gradients.");

  const torch::Device device = grads.empty() ? torch::Device(torch::kCPU) : grads.front().device();
  // inv_scale as torch computes it: reciprocal in double, then rounded to float.
  const float inv = static_cast<float>(1.0 / scale_);
  if (device.is_cpu()) {
    const bool found = non_finite_check_and_unscale_cpu(grads, inv);
    s.found_inf = torch::full({1}, found ? 1.0f : 0.0f);
    s.found_inf_host = found ? 1 : 0;  // known on the host already: no read needed later
  } else {
    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
    s.found_inf = torch::zeros({1}, opts);
    non_finite_check_and_unscale_(grads, s.found_inf, torch::full({1}, inv, opts));
    s.found_inf_host = -1;
  }
  if (reduce_found_inf_) {
    reduce_found_inf_(s.found_inf);  // every rank now holds the same verdict
    s.found_inf_host = -1;
  }
  s.stage = Stage::kUnscaled;
}

bool GradScaler::read_found_inf(OptState& s) {
  // The one host read per step (for CUDA grads); CPU results are known already.
  if (s.found_inf_host < 0) s.found_inf_host = s.found_inf.item<float>() != 0.0f ? 1 : 0;
  return s.found_inf_host == 1;
}

bool GradScaler::prepare_step(torch::optim::Optimizer& opt) {
  if (!is_enabled()) return true;
  OptState& s = state_for(opt);
  TORCH_CHECK(s.stage != Stage::kStepped, "step() has already been called since the last update().");
  if (s.stage == Stage::kReady) unscale_(opt);
  TORCH_INTERNAL_ASSERT(s.found_inf.defined(), "No inf checks were recorded for this optimizer.");
  const bool overflow = read_found_inf(s);
  s.stage = Stage::kStepped;
  return !overflow;
}

bool GradScaler::step(torch::optim::Optimizer& opt) {
  if (!is_enabled()) {
    opt.step();
    return true;
  }
  const bool ok = prepare_step(opt);
  if (ok) opt.step();
  return ok;
}

void GradScaler::update(double new_scale) {
  if (!is_enabled()) return;
  TORCH_CHECK(new_scale > 0 && std::isfinite(new_scale), "Invalid new_scale: ", new_scale, " (must be > 0)");
  scale_ = as_float(new_scale);
  sync_scale_tensor();
  per_opt_.clear();
}

void GradScaler::update() {
  if (!is_enabled()) return;
  bool overflow = false, recorded = false;
  for (auto& kv : per_opt_) {
    if (kv.second.stage == Stage::kReady) continue;
    recorded = true;
    overflow = read_found_inf(kv.second) || overflow;
  }
  TORCH_CHECK(recorded, "No inf checks were recorded prior to update().");
  per_opt_.clear();
  last_overflow_ = overflow;
  const auto& o = options_;
  if (overflow) {
    growth_tracker_ = 0;
    if (--hysteresis_left_ > 0) return;  // tolerated (hysteresis > 1 only)
    hysteresis_left_ = 0;
    TORCH_CHECK(!(o.min_scale() > 0 && scale_ <= o.min_scale()), "GradScaler: gradients still overflow at min_scale ",
                o.min_scale(), "; the model is not fp16-safe at this lr (lower the lr, clip gradients, or use bf16/fp32)");
    scale_ = as_float(std::max(scale_ * o.backoff_factor(), o.min_scale()));
  } else {
    hysteresis_left_ = o.hysteresis();
    if (++growth_tracker_ == o.growth_interval()) {
      const double grown = as_float(std::min(scale_ * o.growth_factor(), o.max_scale()));
      if (std::isfinite(grown)) scale_ = as_float(grown);
      growth_tracker_ = 0;
    }
  }
  sync_scale_tensor();
}

double GradScaler::get_scale() const { return is_enabled() ? scale_ : 1.0; }

std::map<std::string, double> GradScaler::state_dict() const {
  if (!is_enabled()) return {};
  return {{"scale", scale_},
          {"growth_factor", options_.growth_factor()},
          {"backoff_factor", options_.backoff_factor()},
          {"growth_interval", static_cast<double>(options_.growth_interval())},
          {"_growth_tracker", static_cast<double>(growth_tracker_)},
          {"_hysteresis_tracker", static_cast<double>(hysteresis_left_)}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  TORCH_CHECK(is_enabled(), "GradScaler.load_state_dict() on a disabled GradScaler");
  TORCH_CHECK(!state.empty(),
              "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.");
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})
    TORCH_CHECK(state.count(key), "GradScaler state dict is missing '", key, "'");
  GradScalerOptions o = options_;
  o.init_scale(state.at("scale"))
      .growth_factor(state.at("growth_factor"))
      .backoff_factor(state.at("backoff_factor"))
      .growth_interval(static_cast<int64_t>(state.at("growth_interval")));
  GradScaler validated(o);  // same checks as the constructor
  options_ = o;
  scale_ = as_float(state.at("scale"));
  growth_tracker_ = static_cast<int64_t>(state.at("_growth_tracker"));
  hysteresis_left_ = state.count("_hysteresis_tracker") ? static_cast<int64_t>(state.at("_hysteresis_tracker"))
                                                        : options_.hysteresis();
  sync_scale_tensor();
  per_opt_.clear();
}

} // namespace mixtrain::amp
