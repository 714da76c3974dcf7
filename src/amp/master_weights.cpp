#include "mixtrain/amp/master_weights.h"

#include "mixtrain/core/precision_modes.h"

#include "mixtrain/compat.h"

#include "util/archive_util.h"
#include "dispatch_mode.h"
#include "mixtrain/amp/unscale.h"
#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/util/host_read.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/models/module_scope.h"
#include "mixtrain/util/option_error.h"

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace mixtrain::amp {

namespace {

/// Converts the floating-point parameters and buffers of every module to `dtype`,
/// except those of norm layers and fp32 islands, in place (the tensors the
/// optimizer holds stay the same objects).
void convert_model(torch::nn::Module& model, c10::ScalarType dtype, const std::vector<std::string>& keep_fp32 = {}) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const torch::nn::Module* m = item.value().get();
    const bool island = std::any_of(keep_fp32.begin(), keep_fp32.end(),
                                    [&](const std::string& p) { return module_path_matches(p, item.key()); });
    const c10::ScalarType target = is_norm_layer(*m) || island ? torch::kFloat : dtype;
    for (auto& p : m->parameters(/*recurse=*/false))
      if (p.is_floating_point() && p.scalar_type() != target) p.set_data(p.data().to(target));
    for (auto& b : m->buffers(/*recurse=*/false))
      if (b.is_floating_point() && b.scalar_type() != target) b.set_data(b.data().to(target));
  }
}

/// An optimizer of the Learner's type (from its factory) over `groups`, each
/// keeping the options of the same-index group of the current optimizer.
std::unique_ptr<torch::optim::Optimizer> rebuilt_optimizer(Learner& learn,
                                                           const std::vector<std::vector<torch::Tensor>>& groups) {
  torch::optim::Optimizer& old = learn.opt();
  std::vector<torch::Tensor> all;
  std::vector<torch::optim::OptimizerParamGroup> new_groups;
  for (size_t i = 0; i < groups.size(); ++i) {
    all.insert(all.end(), groups[i].begin(), groups[i].end());
    new_groups.emplace_back(groups[i], old.param_groups()[i].options().clone());
  }
  auto fresh = learn.options().opt_func()(all, get_lr(old));
  // Adagrad makes its state in its constructor, which add_param_group refuses: set aside.
  auto made = std::move(fresh->state());
  fresh->state().clear();
  fresh->param_groups().clear();
  for (auto& g : new_groups) fresh->add_param_group(g);
  fresh->state() = std::move(made);
  // The state moves with the values (the masters take over the model's moments, and
  // give them back on to_fp32): a run continued in another mode keeps its optimizer
  // state. A flat master is one tensor for many: its state starts afresh.
  for (size_t i = 0; i < groups.size() && i < old.param_groups().size(); ++i) {
    const auto& before = old.param_groups()[i].params();
    if (before.size() != groups[i].size()) continue;
    for (size_t j = 0; j < before.size(); ++j)
      if (before[j].sizes() == groups[i][j].sizes()) compat::move_optimizer_state(old, before[j], *fresh, groups[i][j]);
  }
  return fresh;
}

int64_t bytes(const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

/// fastai v1's dynamic rule as LossScaleRule's parameters: halve on overflow while
/// above 1, double after max_noskip clean steps, up to max_scale.
LossScaleRuleOptions v1_rule(const MasterWeightsOptions& o) {
  LossScaleRuleOptions r;
  r.growth_factor = 2.0;
  r.backoff_factor = 0.5;
  r.growth_interval = o.max_noskip();
  r.min_scale = 1.0;
  r.throw_at_min_scale = false;
  r.max_scale = o.max_scale();
  return r;
}

} // namespace

void validate(const MasterWeightsOptions& o) {
  TORCH_CHECK(o.dtype() == torch::kHalf || o.dtype() == torch::kBFloat16,
              "MasterWeights: dtype must be Half or BFloat16, got ", o.dtype());
  check_option(o.max_noskip() >= 1, "max_noskip", o.max_noskip(), "must be >= 1");
  check_option(o.max_scale() >= 1 && !std::isnan(o.max_scale()), "max_scale", o.max_scale(), "must be >= 1");
  check_option(o.loss_scale() >= 0 && std::isfinite(o.loss_scale()), "loss_scale", o.loss_scale(),
               "must be > 0; 0 picks the default");
  check_option(o.clip() >= 0 && std::isfinite(o.clip()), "clip", o.clip(), "must be > 0; 0 is off");
}

Precision MasterWeights::precision() const { return precision_for(options_.dtype(), /*master_weights=*/true); }

MasterWeights::MasterWeights(Learner& learn, MasterWeightsOptions options)
    : options_(options),
      rule_(options.loss_scale() > 0 ? options.loss_scale() : (options.dynamic() ? kDefaultInitScale : 512.0), v1_rule(options)) {
  order = 10;
  validate(options_);
  const auto dtype = options_.dtype();
  check_mode_runs_on(precision(), learn.device().is_cpu());  // fp16 masters: the table's refusal on a CPU

  // The optimizer's param groups decide the master groups; create it now if needed.
  torch::optim::Optimizer& opt = learn.opt();
  convert_model(learn.model().module(), dtype, options_.keep_fp32());
  {
    torch::NoGradGuard no_grad;
    for (auto& group : opt.param_groups()) {
      Group g;
      g.params = group.params();
      if (options_.flat_master()) {
        std::vector<torch::Tensor> flat_parts;
        for (const auto& p : g.params) flat_parts.push_back(p.detach().reshape({-1}).to(torch::kFloat));
        g.flat = flat_parts.empty() ? torch::zeros({0}) : torch::cat(flat_parts);
        g.flat.set_requires_grad(true);
        int64_t offset = 0;
        for (const auto& p : g.params) {
          g.masters.push_back(g.flat.detach().narrow(0, offset, p.numel()).view(p.sizes()));
          offset += p.numel();
        }
        masters_.push_back(g.flat);
      } else {
        for (const auto& p : g.params) {
          torch::Tensor m = p.detach().to(torch::kFloat).clone();
          m.set_requires_grad(true);
          g.masters.push_back(m);
          masters_.push_back(m);
        }
      }
      for (const auto& p : g.params) model_params_.push_back(p);
      groups_.push_back(std::move(g));
    }
  }
  rebuild_optimizer(learn);
}

MasterWeights::~MasterWeights() = default;

void MasterWeights::rebuild_optimizer(Learner& learn) {
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& g : groups_)
    groups.push_back(options_.flat_master() ? std::vector<torch::Tensor>{g.flat} : g.masters);
  auto fresh = rebuilt_optimizer(learn, groups);
  optimizer_ = fresh.get();
  learn.set_opt(std::move(fresh));
}

std::vector<torch::Tensor> MasterWeights::state_tensors() const {
  std::vector<torch::Tensor> out;
  for (const auto& m : masters_) out.push_back(m.detach());
  return out;
}

ParamMemory MasterWeights::memory() const {
  ParamMemory m;
  // A gradient is counted for every trained tensor whether or not it is allocated now:
  // zero_grad() frees them between steps (torch 2.x's set_to_none), but each step holds
  // them all at its peak (the model's half gradients, then the masters' fp32 ones).
  for (const auto& p : model_params_) {
    m.model += bytes(p);
    if (p.requires_grad()) m.grads += bytes(p);
  }
  for (const auto& g : groups_) {
    if (options_.flat_master()) {
      m.masters += bytes(g.flat);
      m.grads += bytes(g.flat);
    } else {
      for (const auto& t : g.masters) {
        m.masters += bytes(t);
        m.grads += bytes(t);
      }
    }
  }
  return m;
}

void MasterWeights::before_fit(Learner& learn) {
  TORCH_CHECK(&learn.opt() == optimizer_,
              "MasterWeights: the optimizer was replaced after to_half(); call to_half() again");
  // Weights put into the model since the masters were made (loaded from a file,
  // copied by the user) would be overwritten by the old masters at the first step:
  // such a parameter's master takes the model's value. An untouched parameter equals
  // its master rounded to the model's dtype and keeps the master's fp32 precision.
  torch::NoGradGuard no_grad;
  for (auto& g : groups_)
    for (size_t i = 0; i < g.params.size(); ++i) {
      const torch::Tensor& p = g.params[i];
      if (!torch::equal(p, g.masters[i].to(p.scalar_type()))) g.masters[i].copy_(p);
    }
}

void MasterWeights::before_batch(Learner& learn) {
  // The model's inputs in its dtype (a half conv rejects a float input); integer inputs (tokens) stay.
  const auto to_model_dtype = [this](torch::Tensor& x) {
    if (x.is_floating_point() && x.scalar_type() != options_.dtype()) x = x.to(options_.dtype());
  };
  to_model_dtype(learn.batch().x);
  for (auto& x : learn.batch().extra_x) to_model_dtype(x);
  norm_mode_ = std::make_shared<detail::DispatchModeGuard>(detail::Mode::kFp32Norms);
  if (!options_.keep_fp32().empty()) {
    if (!island_params_)
      island_params_ = std::make_shared<const IslandParams>(island_params(options_.keep_fp32(), learn.model().module()));
    islands_ = std::make_shared<Fp32Islands>(options_.keep_fp32(), island_params_);
  }
}

void MasterWeights::after_pred(Learner& learn) {
  torch::Tensor& pred = learn.pred();
  if (options_.loss_fp32() && pred.is_floating_point() && pred.scalar_type() != torch::kFloat)
    pred = pred.to(torch::kFloat);
}

void MasterWeights::after_loss(Learner&) { end_forward_region(); }
void MasterWeights::after_batch(Learner&) { end_forward_region(); }
void MasterWeights::after_cancel_batch(Learner&) { end_forward_region(); }
void MasterWeights::after_fit(Learner&) { end_forward_region(); }
void MasterWeights::on_error(Learner&) { end_forward_region(); }

void MasterWeights::end_forward_region() {
  islands_.reset();
  norm_mode_.reset();
}

void MasterWeights::before_backward(Learner& learn) { learn.loss_grad() = learn.loss_grad() * rule_.scale(); }

std::string MasterWeights::mode_tag() const { return std::string("master_weights:") + c10::toString(options_.dtype()); }

void MasterWeights::before_step(Learner& learn) {
  stepped_ = false;
  untouched_.clear();
  const double scale_used = rule_.scale();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model_params_) grads.push_back(p.grad());
  // One fused pass; the flag stays on the device and is read with the loss in
  // the step's one device-to-host transfer (the log and the NaN stop use it).
  torch::Tensor flag = non_finite_flag(grads);
  if (reduce_overflow_) reduce_overflow_(flag);
  const std::vector<double> host = read_to_host({flag, learn.loss()});
  const bool overflow = host[0] != 0.0;
  learn.provide_loss_value(host[1]);
  learn.step_info().scale = scale_used;
  learn.step_info().skipped = overflow;
  if (overflow) {
    // A true skip: no optimizer call at all, so no weight decay and no momentum.
    if (options_.dynamic()) rule_.update(/*overflow=*/true);
    for (auto& p : model_params_) p.mutable_grad() = torch::Tensor();
    throw CancelStepException();
  }
  torch::NoGradGuard no_grad;
  for (auto& g : groups_) {
    if (options_.flat_master()) {
      const bool any_grad = std::any_of(g.params.begin(), g.params.end(),
                                        [](const torch::Tensor& p) { return p.grad().defined(); });
      if (!any_grad) {
        // A wholly frozen group: no gradient, so the optimizer skips the buffer and its state.
        g.flat.mutable_grad() = torch::Tensor();
        continue;
      }
      if (!g.flat.grad().defined()) g.flat.mutable_grad() = torch::zeros_like(g.flat);
      std::vector<torch::Tensor> parts;
      for (size_t i = 0; i < g.params.size(); ++i) {
        const torch::Tensor& p = g.params[i];
        parts.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
        // A parameter without a gradient (frozen, unused) is stepped with the flat
        // buffer; its master is put back after the step, as per-parameter masters
        // (which the optimizer skips) leave it.
        if (!p.grad().defined()) untouched_.emplace_back(g.masters[i], g.masters[i].clone());
      }
      if (!parts.empty()) at::cat_out(g.flat.mutable_grad(), parts);  // one kernel, cast to fp32 on write
      g.flat.mutable_grad().div_(scale_used);
    } else {
      for (size_t i = 0; i < g.params.size(); ++i) {
        const torch::Tensor& pg = g.params[i].grad();
        torch::Tensor& mg = g.masters[i].mutable_grad();
        if (!pg.defined()) {
          // Frozen or unused: no gradient, so the optimizer leaves the master
          // alone (a stale or zeroed one would still move it through momentum).
          mg = torch::Tensor();
          continue;
        }
        if (!mg.defined()) mg = torch::empty_like(g.masters[i]);
        mg.copy_(pg).div_(scale_used);
      }
    }
  }
  for (auto& p : model_params_) p.mutable_grad() = torch::Tensor();
  if (options_.clip() > 0)
    learn.step_info().grad_norm = torch::nn::utils::clip_grad_norm_(masters_, options_.clip());
  stepped_ = true;
}

void MasterWeights::after_step(Learner&) {
  if (!stepped_) return;  // after a cancelled step nothing moved
  stepped_ = false;
  {
    torch::NoGradGuard no_grad;
    for (auto& [master, before] : untouched_) master.copy_(before);
    untouched_.clear();
  }
  copy_masters_to_model();
  if (options_.dynamic()) rule_.update(/*overflow=*/false);
}

void MasterWeights::copy_masters_to_model() {
  torch::NoGradGuard no_grad;
  for (auto& g : groups_)
    for (size_t i = 0; i < g.params.size(); ++i) g.params[i].copy_(g.masters[i]);
}

void MasterWeights::save_state(torch::serialize::OutputArchive& ar) const {
  mixtrain::detail::write_f64(ar, "scale", rule_.scale());
  mixtrain::detail::write_i64(ar, "noskip", rule_.growth_tracker());
  mixtrain::detail::write_i64(ar, "num_masters", static_cast<int64_t>(masters_.size()));
  for (size_t i = 0; i < masters_.size(); ++i) ar.write("master." + std::to_string(i), masters_[i].detach());
}

void MasterWeights::load_state(torch::serialize::InputArchive& ar) {
  const int64_t n = mixtrain::detail::read_i64(ar, "num_masters");
  TORCH_CHECK(n == static_cast<int64_t>(masters_.size()), "saved ", n, " master tensors, this learner has ",
              masters_.size(), " (flat_master differs?)");
  std::vector<torch::Tensor> loaded;
  for (size_t i = 0; i < masters_.size(); ++i) {
    torch::Tensor t = mixtrain::detail::read_tensor(ar, "master." + std::to_string(i));
    TORCH_CHECK(t.sizes() == masters_[i].sizes() && t.scalar_type() == torch::kFloat, "master ", i,
                " does not match (shape ", t.sizes(), " vs ", masters_[i].sizes(), ")");
    loaded.push_back(t);
  }
  const double scale = mixtrain::detail::read_f64(ar, "scale");
  const int64_t noskip = mixtrain::detail::read_i64(ar, "noskip");
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) masters_[i].copy_(loaded[i]);
  rule_.set_scale(scale);
  rule_.set_counters(noskip, rule_.options().hysteresis);
}

void MasterWeights::detach(Learner& learn) {
  {
    torch::NoGradGuard no_grad;
    for (auto& g : groups_)
      for (size_t i = 0; i < g.params.size(); ++i) g.params[i].set_data(g.masters[i].detach().clone());
  }
  convert_model(learn.model().module(), torch::kFloat);
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& g : groups_) groups.push_back(g.params);
  learn.set_opt(rebuilt_optimizer(learn, groups));
}

} // namespace mixtrain::amp

