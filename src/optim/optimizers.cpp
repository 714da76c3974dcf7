#include "mixtrain/optim/optimizers.h"

#include "mixtrain/optim/update_rule.h"

#include <torch/serialize/archive.h>
#include <torch/torch.h>

#include <string>
#include <tuple>

namespace mixtrain::optim {

namespace {

using torch::Tensor;
namespace to = torch::optim;

/// A group's hyper-parameters as the core reads them.
UpdateRule rule_of(const to::OptimizerOptions& o) {
  UpdateRule r;
  if (const auto* a = dynamic_cast<const to::AdamWOptions*>(&o)) {
    r.kind = OptimizerKind::kAdamW;
    r.lr = a->lr();
    std::tie(r.beta1, r.beta2) = a->betas();
    r.eps = a->eps();
    r.weight_decay = a->weight_decay();
    r.amsgrad = a->amsgrad();
  } else if (const auto* b = dynamic_cast<const to::AdamOptions*>(&o)) {
    r.kind = OptimizerKind::kAdam;
    r.lr = b->lr();
    std::tie(r.beta1, r.beta2) = b->betas();
    r.eps = b->eps();
    r.weight_decay = b->weight_decay();
    r.amsgrad = b->amsgrad();
  } else if (const auto* c = dynamic_cast<const to::SGDOptions*>(&o)) {
    r.kind = OptimizerKind::kSgd;
    r.lr = c->lr();
    r.momentum = c->momentum();
    r.dampening = c->dampening();
    r.weight_decay = c->weight_decay();
    r.nesterov = c->nesterov();
  } else if (const auto* d = dynamic_cast<const to::RMSpropOptions*>(&o)) {
    r.kind = OptimizerKind::kRmsprop;
    r.lr = d->lr();
    r.alpha = d->alpha();
    r.eps = d->eps();
    r.weight_decay = d->weight_decay();
    r.momentum = d->momentum();
    r.centered = d->centered();
  } else if (const auto* e = dynamic_cast<const to::AdagradOptions*>(&o)) {
    r.kind = OptimizerKind::kAdagrad;
    r.lr = e->lr();
    r.lr_decay = e->lr_decay();
    r.weight_decay = e->weight_decay();
    r.eps = e->eps();
  } else {
    TORCH_CHECK(false, "mixtrain::optim: a param group's options are not AdamW's, Adam's, SGD's, RMSprop's or Adagrad's");
  }
  return r;
}

Tensor zeros_of(const Tensor& p) { return torch::zeros_like(p, at::MemoryFormat::Preserve); }

/// Tensor `t` made ready (zeros of `p`'s shape and dtype) if it is not yet.
Tensor& ready(Tensor& t, const Tensor& p) {
  if (!t.defined()) t = zeros_of(p.detach());
  return t;
}

/// `p`'s state for this step, created in the parameter's dtype where it is missing (a
/// bf16 model's moments are bf16): its tensors in state_names(rule)'s order, its step
/// count advanced.
void prepare_state(to::Optimizer& self, const UpdateRule& rule, const Tensor& p, ParamStep& s) {
  auto& slot = self.state()[p.unsafeGetTensorImpl()];
  switch (rule.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam: {
      // AdamW's and Adam's states are two types with the same fields.
      auto fill = [&](auto* st) {
        st->step(st->step() + 1);
        s.step = st->step();
        s.state = {ready(st->exp_avg(), p), ready(st->exp_avg_sq(), p)};
        if (rule.amsgrad) s.state.push_back(ready(st->max_exp_avg_sq(), p));
      };
      if (rule.kind == OptimizerKind::kAdamW) {
        if (!slot) slot = std::make_unique<to::AdamWParamState>();
        fill(static_cast<to::AdamWParamState*>(slot.get()));
      } else {
        if (!slot) slot = std::make_unique<to::AdamParamState>();
        fill(static_cast<to::AdamParamState*>(slot.get()));
      }
      return;
    }
    case OptimizerKind::kSgd: {
      if (!slot) slot = std::make_unique<to::SGDParamState>();
      auto* st = static_cast<to::SGDParamState*>(slot.get());
      s.step = 1;  // SGD reads no step
      s.state.clear();
      if (rule.momentum != 0) {
        s.fresh_momentum = !st->momentum_buffer().defined();
        s.state.push_back(ready(st->momentum_buffer(), p));
      }
      return;
    }
    case OptimizerKind::kRmsprop: {
      if (!slot) slot = std::make_unique<to::RMSpropParamState>();
      auto* st = static_cast<to::RMSpropParamState*>(slot.get());
      st->step(st->step() + 1);
      s.step = st->step();
      s.state = {ready(st->square_avg(), p)};
      if (rule.momentum > 0) s.state.push_back(ready(st->momentum_buffer(), p));
      if (rule.centered) s.state.push_back(ready(st->grad_avg(), p));
      return;
    }
    case OptimizerKind::kAdagrad: {
      if (!slot) {
        // torch's Adagrad makes its state when it is built; a group added later makes it here.
        auto st = std::make_unique<to::AdagradParamState>();
        const double init = static_cast<const to::AdagradOptions&>(self.defaults()).initial_accumulator_value();
        st->sum(torch::full_like(p.detach(), init, at::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto* st = static_cast<to::AdagradParamState*>(slot.get());
      st->step(st->step() + 1);
      s.step = st->step();
      s.state = {ready(st->sum(), p)};
      return;
    }
  }
}

const char* const kStepsKey = "mixtrain_rounding/steps";
const char* const kRuleKey = "mixtrain_rounding/weight_update";
std::string compensation_key(size_t index) { return "mixtrain_rounding/compensation/" + std::to_string(index); }

} // namespace

amp::LostUpdates RoundedSteps::lost_updates() {
  amp::LostUpdates total;
  for (const auto& l : lost_) total += l;
  lost_.assign(lost_.size(), amp::LostUpdates());
  return total;
}

std::vector<amp::LostUpdates> RoundedSteps::take_lost_updates_per_param() {
  std::vector<amp::LostUpdates> out(lost_.size());
  out.swap(lost_);
  return out;
}

Tensor RoundedSteps::compensation(const Tensor& param) const {
  const auto it = compensation_.find(param.unsafeGetTensorImpl());
  return it == compensation_.end() ? Tensor() : it->second;
}

void RoundedSteps::set_compensation(const Tensor& param, Tensor compensation) {
  TORCH_CHECK(!compensation.defined() || compensation.sizes() == param.sizes(), "mixtrain::optim: a compensation of shape ",
              compensation.sizes(), " for a parameter of shape ", param.sizes());
  compensation_[param.unsafeGetTensorImpl()] = compensation.defined() ? compensation.to(param.options()) : compensation;
}

Tensor RoundedSteps::rounded_step(to::Optimizer& self, const to::Optimizer::LossClosure& closure) {
  Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  ++steps_;
  size_t index = 0;
  const amp::WeightUpdate how = rounding_.weight_update();
  for (auto& group : self.param_groups()) {
    const UpdateRule rule = rule_of(group.options());
    // The group's parameters in one pass (update_parameters: one parallel region for all).
    std::vector<ParamStep> steps;
    std::vector<size_t> indices;
    for (const Tensor& p : group.params()) {
      const size_t i = index++;
      if (lost_.size() <= i) lost_.resize(i + 1);
      if (!p.grad().defined()) continue;
      ParamStep s;
      s.param = p;
      s.grad = p.grad();
      prepare_state(self, rule, p, s);
      if (how == amp::WeightUpdate::kKahan && p.scalar_type() == torch::kBFloat16) {
        Tensor& comp = compensation_[p.unsafeGetTensorImpl()];
        s.compensation = ready(comp, p);
      }
      s.stream = amp::stochastic_stream(steps_, i);
      steps.push_back(std::move(s));
      indices.push_back(i);
    }
    const std::vector<amp::LostUpdates> counts = update_parameters(rule, steps, how, rounding_.seed());
    for (size_t k = 0; k < counts.size(); ++k) lost_[indices[k]] += counts[k];
  }
  return loss;
}

void RoundedSteps::save_rounding(const to::Optimizer& self, torch::serialize::OutputArchive& archive) const {
  archive.write(kStepsKey, torch::tensor(steps_, torch::kLong));
  archive.write(kRuleKey, torch::tensor(static_cast<int64_t>(rounding_.weight_update()), torch::kLong));
  size_t index = 0;
  for (const auto& group : self.param_groups())
    for (const Tensor& p : group.params()) {
      const auto it = compensation_.find(p.unsafeGetTensorImpl());
      if (it != compensation_.end() && it->second.defined()) archive.write(compensation_key(index), it->second);
      ++index;
    }
}

void RoundedSteps::load_rounding(const to::Optimizer& self, torch::serialize::InputArchive& archive) {
  Tensor steps, rule;
  // An archive torch's own optimizer saved has neither: it starts the rounding afresh.
  if (!archive.try_read(kStepsKey, steps)) return;
  TORCH_CHECK(archive.try_read(kRuleKey, rule), "mixtrain::optim: the archive has a step count but no weight_update");
  const int64_t code = rule.numel() == 1 ? rule.item<int64_t>() : -1;
  TORCH_CHECK(code == static_cast<int64_t>(amp::WeightUpdate::kNearest) ||
                  code == static_cast<int64_t>(amp::WeightUpdate::kStochastic) ||
                  code == static_cast<int64_t>(amp::WeightUpdate::kKahan),
              "mixtrain::optim: the archive's weight_update is none of nearest, stochastic and kahan (damaged)");
  const auto saved = static_cast<amp::WeightUpdate>(code);
  // The rule is how this optimizer rounds from now on (a branch may change it); only
  // Kahan's compensations are state, which another rule would drop.
  TORCH_CHECK(saved != amp::WeightUpdate::kKahan || rounding_.weight_update() == amp::WeightUpdate::kKahan,
              "mixtrain::optim: the archive was saved with weight_update=kahan, this optimizer rounds by ",
              amp::weight_update_name(rounding_.weight_update()), " and would drop its Kahan compensations");
  steps_ = steps.item<int64_t>();
  compensation_.clear();
  size_t index = 0;
  for (const auto& group : self.param_groups())
    for (const Tensor& p : group.params()) {
      Tensor comp;
      if (archive.try_read(compensation_key(index), comp)) {
        TORCH_CHECK(comp.sizes() == p.sizes(), "mixtrain::optim: the archive's compensation ", index, " has shape ",
                    comp.sizes(), ", the parameter ", p.sizes());
        compensation_[p.unsafeGetTensorImpl()] = comp.to(p.device(), p.scalar_type());
      }
      ++index;
    }
}

OptimizerFactory factory(const OptimizerSettings& settings, Rounding rounding) {
  return [settings, rounding](const std::vector<Tensor>& params, double lr) -> std::unique_ptr<to::Optimizer> {
    const auto o = optimizer_options(settings, lr);  // mixtrain::optimizer's own options
    switch (settings.kind()) {
      case OptimizerKind::kAdamW: return std::make_unique<AdamW>(params, static_cast<const to::AdamWOptions&>(*o), rounding);
      case OptimizerKind::kAdam: return std::make_unique<Adam>(params, static_cast<const to::AdamOptions&>(*o), rounding);
      case OptimizerKind::kSgd: return std::make_unique<SGD>(params, static_cast<const to::SGDOptions&>(*o), rounding);
      case OptimizerKind::kRmsprop:
        return std::make_unique<RMSprop>(params, static_cast<const to::RMSpropOptions&>(*o), rounding);
      case OptimizerKind::kAdagrad:
        return std::make_unique<Adagrad>(params, static_cast<const to::AdagradOptions&>(*o), rounding);
    }
    return nullptr;
  };
}

} // namespace mixtrain::optim
