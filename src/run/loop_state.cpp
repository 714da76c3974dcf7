// A user's training loop's optimizer state in a Learner (mixtrain/run/loop_state.h):
// torch.optim's state as libtorch's param states, over mixtrain's optimizers.
#include "mixtrain/run/loop_state.h"

#include "mixtrain/optim/optimizers.h"

#include "mixtrain/compat.h"
#include "mixtrain/util/option_error.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace mixtrain::run {

namespace {

/// The loop's state of one parameter as libtorch's optimizer keeps it.
std::unique_ptr<torch::optim::OptimizerParamState> loop_param_state(const std::string& optimizer, const std::string& name,
                                                                    const std::map<std::string, at::Tensor>& st,
                                                                    const torch::Tensor& p) {
  const auto tensor = [&](const char* key, bool required) {
    const auto it = st.find(key);
    if (it == st.end() || !it->second.defined()) {
      if (required) throw OptionError("optimizer", Phrase("the optimizer's state of " + name + " has no " + key));
      return torch::Tensor();
    }
    TORCH_CHECK(it->second.sizes() == p.sizes(), "the optimizer's ", key, " of ", name, " has shape ", it->second.sizes(),
                ", the parameter ", p.sizes());
    return it->second.to(p.device(), torch::kFloat).contiguous().clone();  // bf16 state's values, exactly
  };
  const auto step = [&] {
    const auto it = st.find("step");
    if (it == st.end() || !it->second.defined()) throw OptionError("optimizer", Phrase("the optimizer's state of " + name + " has no step"));
    return static_cast<int64_t>(std::llround(it->second.item<double>()));
  };
  if (optimizer == "sgd") {
    auto out = std::make_unique<torch::optim::SGDParamState>();
    out->momentum_buffer(tensor("momentum_buffer", false));
    if (!out->momentum_buffer().defined()) return nullptr;  // SGD without momentum keeps nothing
    return out;
  }
  if (optimizer == "rmsprop") {
    auto out = std::make_unique<torch::optim::RMSpropParamState>();
    out->step(step());
    out->square_avg(tensor("square_avg", true));
    out->momentum_buffer(tensor("momentum_buffer", false));
    out->grad_avg(tensor("grad_avg", false));
    return out;
  }
  if (optimizer == "adagrad") {
    auto out = std::make_unique<torch::optim::AdagradParamState>();
    out->step(step());
    out->sum(tensor("sum", true));
    return out;
  }
  const auto fill = [&](auto& out) {
    out->step(step());
    out->exp_avg(tensor("exp_avg", true));
    out->exp_avg_sq(tensor("exp_avg_sq", true));
    const torch::Tensor max_sq = tensor("max_exp_avg_sq", false);
    if (max_sq.defined()) out->max_exp_avg_sq(max_sq);
  };
  if (optimizer == "adamw") {
    auto out = std::make_unique<torch::optim::AdamWParamState>();
    fill(out);
    return out;
  }
  auto out = std::make_unique<torch::optim::AdamParamState>();
  fill(out);
  return out;
}

/// The model's parameters by name.
std::map<std::string, torch::Tensor> params_by_name(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : module.named_parameters()) out.emplace(p.key(), p.value());
  return out;
}

} // namespace

int64_t loop_step(const LoopState& loop) {
  int64_t step = -1;  // SGD counts none
  for (const auto& [name, st] : loop.state) {
    const auto it = st.find("step");
    if (it != st.end() && it->second.defined()) step = std::max<int64_t>(step, std::llround(it->second.item<double>()));
  }
  return step;
}

void load_loop_state(Learner& learn, const LoopState& loop) {
  torch::optim::Optimizer& opt = learn.opt();
  const auto params = params_by_name(learn.model().module());
  auto* rounded = dynamic_cast<mixtrain::optim::RoundedSteps*>(&opt);  // mixtrain.optim's rounding state, if ours
  for (const auto& [name, st] : loop.state) {
    const auto p = params.find(name);
    if (p == params.end()) throw OptionError("optimizer", Phrase("the optimizer holds state for " + name + ", which the model does not have"));
    if (auto state = loop_param_state(loop.optimizer, name, st, p->second)) compat::set_optimizer_state(opt, p->second, std::move(state));
    // mixtrain.optim's Kahan compensation ("kahan_comp", a bf16 tensor): the window carries
    // on with what the loop's rounding had kept back, as a resume would.
    const auto comp = st.find("kahan_comp");
    if (rounded && comp != st.end() && comp->second.defined()) {
      TORCH_CHECK(comp->second.sizes() == p->second.sizes(), "the optimizer's kahan_comp of ", name, " has shape ",
                  comp->second.sizes(), ", the parameter ", p->second.sizes());
      rounded->set_compensation(p->second, comp->second.to(p->second.device(), torch::kBFloat16).contiguous().clone());
    }
  }
  // mixtrain.optim draws each stochastic rounding from (step, parameter index): the
  // window goes on from the loop's count, as the loop's optimizer (or the cure's) would.
  if (const int64_t step = loop_step(loop); rounded && step > 0) rounded->set_steps_taken(step);
}

OptimizerFactory loop_optimizer(const LoopState& loop, const Model& model) {
  const std::shared_ptr<torch::nn::Module> module = model.ptr();
  return [&loop, module](const std::vector<torch::Tensor>&, double) -> std::unique_ptr<torch::optim::Optimizer> {
    const auto params = params_by_name(*module);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (const auto& g : loop.groups) {
      std::vector<torch::Tensor> held;
      for (const auto& name : g.params) {
        const auto p = params.find(name);
        if (p == params.end()) throw OptionError("optimizer", Phrase("the optimizer holds " + name + ", which the model does not have"));
        held.push_back(p->second);
      }
      std::unique_ptr<torch::optim::OptimizerOptions> options;
      if (loop.optimizer == "rmsprop")
        options = std::make_unique<torch::optim::RMSpropOptions>(torch::optim::RMSpropOptions(g.lr)
                                                                     .alpha(g.alpha)
                                                                     .eps(g.eps)
                                                                     .weight_decay(g.weight_decay)
                                                                     .momentum(g.momentum)
                                                                     .centered(g.centered));
      else if (loop.optimizer == "adagrad")
        options = std::make_unique<torch::optim::AdagradOptions>(torch::optim::AdagradOptions(g.lr)
                                                                     .lr_decay(g.lr_decay)
                                                                     .weight_decay(g.weight_decay)
                                                                     .initial_accumulator_value(g.initial_accumulator_value)
                                                                     .eps(g.eps));
      else if (loop.optimizer == "sgd")
        options = std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(g.lr)
                                                                 .momentum(g.momentum)
                                                                 .dampening(g.dampening)
                                                                 .nesterov(g.nesterov)
                                                                 .weight_decay(g.weight_decay));
      else if (loop.optimizer == "adamw")
        options = std::make_unique<torch::optim::AdamWOptions>(
            torch::optim::AdamWOptions(g.lr).betas({g.beta1, g.beta2}).eps(g.eps).weight_decay(g.weight_decay).amsgrad(g.amsgrad));
      else
        options = std::make_unique<torch::optim::AdamOptions>(
            torch::optim::AdamOptions(g.lr).betas({g.beta1, g.beta2}).eps(g.eps).weight_decay(g.weight_decay).amsgrad(g.amsgrad));
      groups.emplace_back(std::move(held), std::move(options));
    }
    const auto& first = loop.groups.front();
    if (loop.optimizer == "sgd") return std::make_unique<mixtrain::optim::SGD>(groups, torch::optim::SGDOptions(first.lr));
    if (loop.optimizer == "rmsprop") return std::make_unique<mixtrain::optim::RMSprop>(groups);
    if (loop.optimizer == "adagrad")
      return std::make_unique<mixtrain::optim::Adagrad>(
          groups, torch::optim::AdagradOptions(first.lr).initial_accumulator_value(first.initial_accumulator_value));
    if (loop.optimizer == "adamw") return std::make_unique<mixtrain::optim::AdamW>(groups);
    return std::make_unique<mixtrain::optim::Adam>(groups);
  };
}

} // namespace mixtrain::run
