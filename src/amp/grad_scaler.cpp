#include "mixtrain/amp/grad_scaler.h"

#include "mixtrain/amp/unscale.h"
#include "mixtrain/util/host_read.h"
#include "mixtrain/util/option_error.h"

#include <torch/optim/optimizer.h>

#include <cmath>

namespace mixtrain::amp {

namespace {
LossScaleRuleOptions rule_options(const GradScalerOptions& o) {
  LossScaleRuleOptions r;
  r.growth_factor = o.growth_factor();
  r.backoff_factor = o.backoff_factor();
  r.growth_interval = o.growth_interval();
  r.min_scale = o.min_scale();
  r.throw_at_min_scale = true;
  r.max_scale = o.max_scale();
  r.hysteresis = o.hysteresis();
  r.consecutive_hysteresis = o.consecutive_hysteresis();
  return r;
}
} // namespace

void validate(const GradScalerOptions& o) {
  // OptionError carries the option's key, so a front end names it in its own words.
  check_option(o.init_scale() > 0 && std::isfinite(o.init_scale()), "init_scale", o.init_scale(), "must be > 0 and finite");
  check_option(o.growth_factor() > 1, "growth_factor", o.growth_factor(), "must be > 1");
  check_option(o.backoff_factor() > 0 && o.backoff_factor() < 1, "backoff_factor", o.backoff_factor(), "must be in (0, 1)");
  check_option(o.growth_interval() >= 1, "growth_interval", o.growth_interval(), "must be >= 1");
  check_option(o.min_scale() >= 0, "min_scale", o.min_scale(), "must be >= 0");
  check_option(o.max_scale() > 0, "max_scale", o.max_scale(), "must be > 0");
  check_option(o.min_scale() <= o.init_scale() && o.init_scale() <= o.max_scale(), "init_scale", o.init_scale(),
               c10::str("must lie in [min_scale, max_scale] = [", o.min_scale(), ", ", o.max_scale(), "]"));
  check_option(o.hysteresis() >= 1, "hysteresis", o.hysteresis(), "must be >= 1");
}

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), rule_(options.init_scale(), rule_options(options)) {
  validate(options_);
}

void GradScaler::ensure_scale(const torch::Device& device) {
  if (!scale_tensor_.defined() || scale_tensor_.device() != device)
    scale_tensor_ = torch::full({}, rule_.scale(), torch::TensorOptions().dtype(torch::kFloat).device(device));
}

void GradScaler::sync_scale_tensor() {
  // fill_ with a host scalar launches a kernel on CUDA; it does not synchronize.
  if (scale_tensor_.defined()) scale_tensor_.fill_(rule_.scale());
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
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;  // a parameter without a gradient is ignored
      const torch::Tensor& g = p.grad();
      TORCH_CHECK(g.scalar_type() != torch::kHalf, "Attempting to unscale FP16 gradients.");
      // A sparse gradient (Embedding(sparse=true)) is checked and unscaled through its
      // values, in place, as torch does. (torch coalesces fp16 values first, so that
      // duplicates summed in fp16 are checked; fp16 gradients are refused above.)
      grads.push_back(g.is_sparse() ? g._values() : g);
    }

  const torch::Device device = grads.empty() ? torch::Device(torch::kCPU) : grads.front().device();
  // inv_scale as torch computes it: reciprocal in double, then rounded to float.
  const float inv = static_cast<float>(1.0 / rule_.scale());
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

std::vector<double> GradScaler::read_found_inf(OptState& s, const std::vector<torch::Tensor>& also) {
  // The step's one host read: found_inf (unless known already, as for CPU grads) with `also`.
  const bool known = s.found_inf_host >= 0;
  std::vector<torch::Tensor> reads = also;
  if (!known) reads.insert(reads.begin(), s.found_inf);
  std::vector<double> values = read_to_host(reads);
  if (!known) {
    s.found_inf_host = values.front() != 0.0 ? 1 : 0;
    values.erase(values.begin());
  }
  return values;
}

bool GradScaler::prepare_step(torch::optim::Optimizer& opt) {
  std::vector<double> none;
  return prepare_step(opt, {}, none);
}

bool GradScaler::prepare_step(torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& also,
                              std::vector<double>& values) {
  if (!is_enabled()) {
    values = read_to_host(also);
    return true;
  }
  OptState& s = state_for(opt);
  TORCH_CHECK(s.stage != Stage::kStepped, "step() has already been called since the last update().");
  if (s.stage == Stage::kReady) unscale_(opt);
  TORCH_INTERNAL_ASSERT(s.found_inf.defined(), "No inf checks were recorded for this optimizer.");
  values = read_found_inf(s, also);
  s.stage = Stage::kStepped;
  return s.found_inf_host != 1;
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
  rule_.set_scale(new_scale);
  sync_scale_tensor();
  per_opt_.clear();
}

void GradScaler::update() {
  if (!is_enabled()) return;
  bool overflow = false, recorded = false;
  for (auto& kv : per_opt_) {
    if (kv.second.stage == Stage::kReady) continue;
    recorded = true;
    read_found_inf(kv.second);
    overflow = kv.second.found_inf_host == 1 || overflow;
  }
  TORCH_CHECK(recorded, "No inf checks were recorded prior to update().");
  per_opt_.clear();
  last_overflow_ = overflow;
  rule_.update(overflow);
  sync_scale_tensor();
}

double GradScaler::get_scale() const { return is_enabled() ? rule_.scale() : 1.0; }

GradScalerState GradScaler::state_dict() const {
  GradScalerState state = empty_grad_scaler_state();
  if (!is_enabled()) return state;
  state.insert("scale", rule_.scale());
  state.insert("growth_factor", options_.growth_factor());
  state.insert("backoff_factor", options_.backoff_factor());
  state.insert("growth_interval", options_.growth_interval());
  state.insert("_growth_tracker", rule_.growth_tracker());
  state.insert("_hysteresis_tracker", rule_.hysteresis_left());
  return state;
}

namespace {
/// A number of a state dict, int or float (Python writes `scale` as a float, a
/// hand-made dict may not).
double number(const GradScalerState& state, const char* key) {
  TORCH_CHECK(state.contains(key), "GradScaler state dict is missing '", key, "'");
  const c10::IValue v = state.at(key);
  TORCH_CHECK(v.isDouble() || v.isInt(), "GradScaler state dict: '", key, "' is not a number");
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}
} // namespace

void GradScaler::load_state_dict(const GradScalerState& state) {
  if (!is_enabled()) return;  // torch ignores it too
  TORCH_CHECK(state.size() > 0,
              "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.");
  GradScalerOptions o = options_;
  o.init_scale(number(state, "scale"))
      .growth_factor(number(state, "growth_factor"))
      .backoff_factor(number(state, "backoff_factor"))
      .growth_interval(static_cast<int64_t>(number(state, "growth_interval")));
  const auto tracker = static_cast<int64_t>(number(state, "_growth_tracker"));
  const auto hysteresis = state.contains("_hysteresis_tracker")
                              ? static_cast<int64_t>(number(state, "_hysteresis_tracker"))
                              : o.hysteresis();
  validate(o);
  options_ = o;
  rule_ = LossScaleRule(o.init_scale(), rule_options(o));
  rule_.set_counters(tracker, hysteresis);
  sync_scale_tensor();
  per_opt_.clear();
}

} // namespace mixtrain::amp
