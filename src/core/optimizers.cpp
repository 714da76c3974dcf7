#include "mixtrain/core/optimizers.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace mixtrain {

namespace topt = torch::optim;  // not `optim`: that is mixtrain::optim, our optimizers

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kRmsprop: return "rmsprop";
    case OptimizerKind::kAdagrad: return "adagrad";
  }
  return "?";
}

std::optional<OptimizerKind> parse_optimizer(const std::string& name) {
  for (OptimizerKind k : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd, OptimizerKind::kRmsprop,
                          OptimizerKind::kAdagrad})
    if (name == optimizer_name(k)) return k;
  return std::nullopt;
}

std::optional<OptimizerKind> kind_of(const torch::optim::Optimizer& opt) {
  // AdamW before Adam: neither derives from the other, but the order says which is which.
  if (dynamic_cast<const topt::AdamW*>(&opt)) return OptimizerKind::kAdamW;
  if (dynamic_cast<const topt::Adam*>(&opt)) return OptimizerKind::kAdam;
  if (dynamic_cast<const topt::SGD*>(&opt)) return OptimizerKind::kSgd;
  if (dynamic_cast<const topt::RMSprop*>(&opt)) return OptimizerKind::kRmsprop;
  if (dynamic_cast<const topt::Adagrad*>(&opt)) return OptimizerKind::kAdagrad;
  return std::nullopt;
}

OptimizerSettings OptimizerSettings::resolved() const {
  OptimizerSettings s = *this;
  const auto fill = [](double& v, double fallback) {
    if (std::isnan(v)) v = fallback;
  };
  const bool adam = kind_ == OptimizerKind::kAdamW || kind_ == OptimizerKind::kAdam;
  fill(s.mom_, adam ? 0.9 : 0.0);
  fill(s.sqr_mom_, 0.99);
  fill(s.eps_, adam ? 1e-5 : kind_ == OptimizerKind::kRmsprop ? 1e-8 : 1e-10);
  fill(s.wd_, adam ? 0.01 : 0.0);
  return s;
}

std::unique_ptr<torch::optim::OptimizerOptions> optimizer_options(const OptimizerSettings& settings, double lr) {
  const OptimizerSettings s = settings.resolved();
  switch (s.kind()) {
    case OptimizerKind::kAdamW:
      return std::make_unique<topt::AdamWOptions>(
          topt::AdamWOptions(lr).betas({s.mom(), s.sqr_mom()}).eps(s.eps()).weight_decay(s.wd()));
    case OptimizerKind::kAdam:
      return std::make_unique<topt::AdamOptions>(
          topt::AdamOptions(lr).betas({s.mom(), s.sqr_mom()}).eps(s.eps()).weight_decay(s.wd()));
    case OptimizerKind::kSgd:
      return std::make_unique<topt::SGDOptions>(topt::SGDOptions(lr).momentum(s.mom()).weight_decay(s.wd()));
    case OptimizerKind::kRmsprop:
      return std::make_unique<topt::RMSpropOptions>(
          topt::RMSpropOptions(lr).alpha(s.sqr_mom()).eps(s.eps()).momentum(s.mom()).weight_decay(s.wd()));
    case OptimizerKind::kAdagrad:
      return std::make_unique<topt::AdagradOptions>(topt::AdagradOptions(lr).eps(s.eps()).weight_decay(s.wd()));
  }
  return nullptr;
}

OptimizerFactory optimizer(const OptimizerSettings& settings) {
  return [settings](const std::vector<torch::Tensor>& params, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
    const auto o = optimizer_options(settings, lr);
    switch (settings.kind()) {
      case OptimizerKind::kAdamW: return std::make_unique<topt::AdamW>(params, static_cast<const topt::AdamWOptions&>(*o));
      case OptimizerKind::kAdam: return std::make_unique<topt::Adam>(params, static_cast<const topt::AdamOptions&>(*o));
      case OptimizerKind::kSgd: return std::make_unique<topt::SGD>(params, static_cast<const topt::SGDOptions&>(*o));
      case OptimizerKind::kRmsprop:
        return std::make_unique<topt::RMSprop>(params, static_cast<const topt::RMSpropOptions&>(*o));
      case OptimizerKind::kAdagrad:
        return std::make_unique<topt::Adagrad>(params, static_cast<const topt::AdagradOptions&>(*o));
    }
    return nullptr;
  };
}

std::optional<int64_t> state_tensors_per_param(const torch::optim::Optimizer& opt) {
  const auto kind = kind_of(opt);
  if (!kind) return std::nullopt;
  if (opt.param_groups().empty()) return 0;
  const auto& o = opt.param_groups().front().options();
  switch (*kind) {
    case OptimizerKind::kAdamW: return static_cast<const topt::AdamWOptions&>(o).amsgrad() ? 3 : 2;
    case OptimizerKind::kAdam: return static_cast<const topt::AdamOptions&>(o).amsgrad() ? 3 : 2;
    case OptimizerKind::kSgd: return static_cast<const topt::SGDOptions&>(o).momentum() != 0 ? 1 : 0;
    case OptimizerKind::kRmsprop: {
      const auto& r = static_cast<const topt::RMSpropOptions&>(o);
      return 1 + (r.momentum() > 0 ? 1 : 0) + (r.centered() ? 1 : 0);
    }
    case OptimizerKind::kAdagrad: return 1;
  }
  return std::nullopt;
}

std::optional<std::vector<torch::Tensor*>> state_tensors(torch::optim::OptimizerParamState& s) {
  if (auto* a = dynamic_cast<topt::AdamWParamState*>(&s)) return std::vector<torch::Tensor*>{&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()};
  if (auto* b = dynamic_cast<topt::AdamParamState*>(&s)) return std::vector<torch::Tensor*>{&b->exp_avg(), &b->exp_avg_sq(), &b->max_exp_avg_sq()};
  if (auto* c = dynamic_cast<topt::SGDParamState*>(&s)) return std::vector<torch::Tensor*>{&c->momentum_buffer()};
  if (auto* d = dynamic_cast<topt::RMSpropParamState*>(&s)) return std::vector<torch::Tensor*>{&d->square_avg(), &d->momentum_buffer(), &d->grad_avg()};
  if (auto* e = dynamic_cast<topt::AdagradParamState*>(&s)) return std::vector<torch::Tensor*>{&e->sum()};
  return std::nullopt;
}

double* momentum_of(torch::optim::OptimizerOptions& o) {
  if (auto* adamw = dynamic_cast<topt::AdamWOptions*>(&o)) return &std::get<0>(adamw->betas());
  if (auto* adam = dynamic_cast<topt::AdamOptions*>(&o)) return &std::get<0>(adam->betas());
  if (auto* sgd = dynamic_cast<topt::SGDOptions*>(&o)) return &sgd->momentum();
  if (auto* rms = dynamic_cast<topt::RMSpropOptions*>(&o)) return &rms->momentum();
  return nullptr;
}

bool zero_weight_decay(torch::optim::OptimizerOptions& o) {
  if (auto* a = dynamic_cast<topt::AdamWOptions*>(&o)) return a->weight_decay(0), true;
  if (auto* a = dynamic_cast<topt::AdamOptions*>(&o)) return a->weight_decay(0), true;
  if (auto* a = dynamic_cast<topt::SGDOptions*>(&o)) return a->weight_decay(0), true;
  if (auto* a = dynamic_cast<topt::RMSpropOptions*>(&o)) return a->weight_decay(0), true;
  if (auto* a = dynamic_cast<topt::AdagradOptions*>(&o)) return a->weight_decay(0), true;
  return false;
}

} // namespace mixtrain
