#include "mixtrain/amp/pure_bf16.h"

#include "mixtrain/models/norm_layer.h"

#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/compat.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/core/optimizers.h"
#include "mixtrain/optim/optimizers.h"
#include "mixtrain/util/option_error.h"

#include "dispatch_mode.h"
#include "util/archive_util.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <unordered_set>
#include <cmath>

namespace mixtrain::amp {

PureBf16::PureBf16(WeightUpdate rule, uint64_t seed)
    : MixedPrecision(c10::ScalarType::BFloat16), rule_(rule), seed_(seed) {}

std::string PureBf16::mode_tag() const { return "pure:BFloat16"; }

void PureBf16::prepare(Learner& learn) {
  torch::nn::Module& module = learn.model().module();
  if (prepared_for_module_ == &module) return;
  const std::optional<int64_t> states = state_tensors_per_param(learn.opt());
  if (!states)
    throw OptionError("precision", Phrase::setting("precision", "bf16-pure") +
                                       " rounds the optimizer state of AdamW, Adam, SGD, RMSprop and Adagrad; this "
                                       "Learner's optimizer is none of them (use one of those, or " +
                                       Phrase::setting("precision", "bf16-master") + ")");
  const std::vector<std::string> islands = keep_fp32();
  const IslandParams in_island = islands.empty() ? IslandParams() : island_params(islands, module);
  torch::NoGradGuard no_grad;
  std::vector<Param> params;
  frozen_.clear();
  int64_t weight_bytes = 0, grad_bytes = 0, state_bytes = 0, compensation_bytes = 0;
  state_tensors_ = *states;
  std::unordered_set<const void*> normed;  // the parameters of norm layers
  for (const auto& m : module.named_modules())
    if (is_norm_layer(*m.value()))
      for (const auto& p : m.value()->parameters(/*recurse=*/false)) normed.insert(p.unsafeGetTensorImpl());
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    torch::Tensor w = item.value();
    const int64_t n = w.numel();
    if (in_island.count(w.unsafeGetTensorImpl())) {  // an island: fp32 weight, gradient and state
      weight_bytes += 4 * n;
      grad_bytes += 4 * n;
      state_bytes += 4 * *states * n;
      continue;
    }
    TORCH_CHECK(w.scalar_type() == torch::kFloat, "bf16-pure trains fp32-stored parameters, but ", item.key(), " is ",
                w.scalar_type(), " (give the Learner the model as it is; the mode rounds it)");
    weight_bytes += 2 * n;
    grad_bytes += 2 * n;
    state_bytes += 2 * *states * n;
    if (!w.requires_grad()) {  // frozen: nothing updates it, but it is stored in bf16
      round_to_bf16_(w);
      frozen_.push_back(w);
      continue;
    }
    Param p;
    p.name = item.key();
    p.in_norm_layer = normed.count(w.unsafeGetTensorImpl()) > 0;
    p.weight = w;
    p.before = torch::empty_like(w);
    if (rule_ == WeightUpdate::kKahan) {
      p.compensation = torch::zeros_like(w);
      compensation_bytes += 2 * n;
    }
    params.push_back(std::move(p));
  }
  // A Learner resumed from a checkpoint already holds this mode's compensations and counts.
  if (params_.size() == params.size()) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params_[i].compensation.defined() && params[i].compensation.defined())
        params[i].compensation.copy_(params_[i].compensation);
      params[i].total = params_[i].total;
    }
  }
  params_ = std::move(params);
  ParamMemory m;
  m.model = weight_bytes;
  m.grads = grad_bytes;
  m.optimizer_state = state_bytes;
  m.compensation = compensation_bytes;
  memory_ = m;
  prepared_for_module_ = &module;
}

void PureBf16::before_fit(Learner& learn) {
  MixedPrecision::before_fit(learn);
  prepare(learn);
  {
    // The trained weights hold bf16 values from the start of every fit, whatever was
    // written to them since the last (a load, a user's edit; a write to a bf16 weight is
    // rounded): the emulated forward takes them as bf16 tensors (before_batch), and a
    // step's lost updates are counted from them.
    torch::NoGradGuard no_grad;
    for (auto& p : params_)
      if (p.weight.scalar_type() == torch::kFloat) round_to_bf16_(p.weight);
  }
  fit_on_bf16_ = false;
  store_in_bf16(learn);
  // A resumed fit goes on counting where its checkpoint left off (its epochs so far,
  // and the one it was interrupted in); any other fit counts from nothing.
  if (!resumed_) {
    per_epoch_.clear();
    epoch_now_ = LostUpdates();
  }
  resumed_ = false;
  step_pending_ = false;
}

namespace {
/// `t` becomes a `dtype` tensor holding the same values, in place (the optimizer and the
/// model keep the same tensor object), its gradient too.
void restore_as(torch::Tensor& t, c10::ScalarType dtype) {
  if (t.scalar_type() == dtype) return;
  if (t.grad().defined()) t.mutable_grad() = t.grad().to(dtype);
  t.set_data(t.detach().to(dtype));
}

/// The optimizer's state tensors of `p` (its moments), in place as `dtype` tensors.
void restore_state_as(torch::optim::Optimizer& opt, const torch::Tensor& p, c10::ScalarType dtype) {
  auto* st = compat::optimizer_state_of(opt, p);
  if (!st) return;
  if (const auto tensors = mixtrain::state_tensors(*st))
    for (torch::Tensor* t : *tensors)
      if (t->defined() && t->is_floating_point() && t->scalar_type() != dtype) *t = t->to(dtype);
}
} // namespace

void PureBf16::store_in_bf16(Learner& learn) {
  auto* rounded = dynamic_cast<optim::RoundedSteps*>(&learn.opt());
  // libtorch's own optimizers would round at every op: they keep fp32 storage, rounded by after_step.
  if (!rounded) return;
  // Under mixtrain's optimizers the stochastic stream is (its step count, the parameter's
  // index in it) on either storage, so a branch of a loop or a run rounds as it would have.
  std::unordered_map<const void*, int64_t> index;
  for (const auto& group : learn.opt().param_groups())
    for (const auto& t : group.params()) index.emplace(t.unsafeGetTensorImpl(), static_cast<int64_t>(index.size()));
  for (auto& p : params_) {
    const auto it = index.find(p.weight.unsafeGetTensorImpl());
    p.opt_index = it == index.end() ? -1 : it->second;
  }
  torch::NoGradGuard no_grad;
  if (emulated()) {
    // The emulated forward reads fp32 tensors as bf16: fp32 storage, rounded by after_step. A
    // compensation the optimizer holds (a loop's state, a checkpoint of bf16 storage) is this
    // callback's to carry on.
    if (rule_ == WeightUpdate::kKahan)
      for (auto& p : params_) {
        const torch::Tensor held = rounded->compensation(p.weight);
        if (!held.defined()) continue;
        if (p.compensation.defined())
          p.compensation.copy_(held);
        else
          p.compensation = held.to(torch::kFloat);
        rounded->set_compensation(p.weight, torch::Tensor());
      }
    return;
  }
  fit_on_bf16_ = true;
  if (rounded->rounding().weight_update() != rule_ || rounded->rounding().seed() != seed_)
    rounded->set_rounding(optim::Rounding().weight_update(rule_).seed(seed_));
  for (auto& p : params_) {
    // A norm layer's kernels take a bf16 input only with fp32 parameters: those stay fp32
    // tensors of bf16 values, rounded by after_step.
    p.bf16 = p.opt_index >= 0 && !p.in_norm_layer;
    if (!p.bf16) continue;
    restore_as(p.weight, torch::kBFloat16);
    restore_state_as(learn.opt(), p.weight, torch::kBFloat16);
    if (rule_ == WeightUpdate::kKahan) {
      // The optimizer's own (loaded with its state, or kept from the last fit) if it has
      // one, else this callback's (a checkpoint of fp32 storage); in bf16 either way.
      const torch::Tensor held = rounded->compensation(p.weight);
      const torch::Tensor c = held.defined() ? held : p.compensation;
      if (c.defined()) rounded->set_compensation(p.weight, c);
    }
    p.compensation = torch::Tensor();  // the optimizer holds it now
    p.before = torch::Tensor();
  }
  for (auto& w : frozen_) restore_as(w, torch::kBFloat16);
  bf16_storage_ = true;
  // What this fit holds, each tensor at its storage's width: bf16 where it is, fp32 for
  // the islands and the norm layers (and their Kahan compensations).
  ParamMemory m;
  for (const auto& w : learn.model().module().parameters(/*recurse=*/true)) {
    const int64_t bytes = w.numel() * static_cast<int64_t>(w.element_size());
    m.model += bytes;
    if (!w.requires_grad()) continue;
    m.grads += bytes;
    m.optimizer_state += state_tensors_ * bytes;
  }
  if (rule_ == WeightUpdate::kKahan)
    for (const auto& p : params_) m.compensation += p.weight.numel() * (p.bf16 ? 2 : 4);
  memory_ = m;
}

void PureBf16::store_in_fp32(Learner& learn) {
  if (!bf16_storage_) return;
  bf16_storage_ = false;
  auto* rounded = dynamic_cast<optim::RoundedSteps*>(&learn.opt());
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (!p.bf16) continue;
    p.bf16 = false;
    restore_as(p.weight, torch::kFloat);
    if (rounded && rule_ == WeightUpdate::kKahan) {
      const torch::Tensor c = rounded->compensation(p.weight);
      p.compensation = c.defined() ? c.to(torch::kFloat) : torch::zeros_like(p.weight);
    }
    p.before = torch::empty_like(p.weight);
  }
  for (auto& w : frozen_) restore_as(w, torch::kFloat);
}

void PureBf16::after_fit(Learner& learn) {
  MixedPrecision::after_fit(learn);
  store_in_fp32(learn);
}

void PureBf16::on_error(Learner& learn) {
  MixedPrecision::on_error(learn);
  store_in_fp32(learn);
}

bool PureBf16::retry_forward_emulated(Learner& learn, const std::function<void()>& forward, const std::string& failure) {
  // The emulation reads fp32 tensors as bf16: it takes this fit's weights back to them.
  const bool was_bf16 = bf16_storage_;
  store_in_fp32(learn);
  if (MixedPrecision::retry_forward_emulated(learn, forward, failure)) return true;
  if (was_bf16) store_in_bf16(learn);
  return false;
}

void PureBf16::before_batch(Learner& learn) {
  MixedPrecision::before_batch(learn);
  // The trained weights hold bf16 values (before_fit, after_step): the emulated ops take
  // them as bf16 tensors, as real bf16-pure's are, instead of rounding a copy of every
  // weight each forward and its gradient on the way back (before_step rounds the
  // gradient). Only while training: validation outside a fit may see weights a user set
  // since, and rounds its copies as before.
  if (learn.training() && ReducedPrecisionEmulation::is_enabled())
    for (const auto& p : params_) detail::mark_reduced(p.weight);
}

void PureBf16::before_step(Learner& learn) {
  MixedPrecision::before_step(learn);
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (p.bf16) continue;  // a bf16 tensor with a bf16 gradient: the optimizer rounds it
    // Gradients are bf16 too; the step reads them as the bf16 values they are.
    if (p.weight.grad().defined() && p.weight.grad().scalar_type() == torch::kFloat) {
      torch::Tensor g = p.weight.mutable_grad();
      round_to_bf16_(g);
    }
    p.before.copy_(p.weight);
  }
  step_pending_ = true;
}

void PureBf16::after_cancel_step(Learner& learn) {
  MixedPrecision::after_cancel_step(learn);
  step_pending_ = false;  // no update to round
}

void PureBf16::after_step(Learner& learn) {
  MixedPrecision::after_step(learn);
  if (!step_pending_) return;
  step_pending_ = false;
  torch::NoGradGuard no_grad;
  auto* core = dynamic_cast<optim::RoundedSteps*>(&learn.opt());
  auto* rounded = bf16_storage_ ? core : nullptr;
  // On bf16 storage the optimizer rounded and counted; the fp32 tensors left (norm layers,
  // or every weight on fp32 storage) are rounded here, from the stream the optimizer would
  // draw (its step count and parameter index) where it is mixtrain's.
  const std::vector<LostUpdates> counted = rounded ? rounded->take_lost_updates_per_param() : std::vector<LostUpdates>();
  const int64_t step = core ? core->steps_taken() : learn.train_iter();
  LostUpdates this_step;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.weight.grad().defined()) continue;  // the optimizer left it alone
    if (p.bf16) {
      const auto at = static_cast<size_t>(p.opt_index);
      const LostUpdates s = at < counted.size() ? counted[at] : LostUpdates();
      p.total += s;
      this_step += s;
      continue;
    }
    const uint64_t stream = core && p.opt_index >= 0 ? stochastic_stream(step, static_cast<size_t>(p.opt_index))
                                                     : stochastic_stream(step, i);
    const LostUpdates s = round_update(p.weight, p.before, rule_, p.compensation.defined() ? &p.compensation : nullptr,
                                       seed_, stream);
    p.total += s;
    this_step += s;
    if (auto* st = compat::optimizer_state_of(learn.opt(), p.weight)) {
      const auto tensors = mixtrain::state_tensors(*st);
      if (tensors)
        for (torch::Tensor* t : *tensors)
          if (t->defined() && t->scalar_type() == torch::kFloat && t->numel() > 0) round_to_bf16_(*t);
    }
  }
  epoch_now_ += this_step;
}

void PureBf16::after_epoch(Learner& learn) {
  MixedPrecision::after_epoch(learn);
  per_epoch_.push_back(epoch_now_);
  epoch_now_ = LostUpdates();
}

std::vector<torch::Tensor> PureBf16::state_tensors() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : params_)
    if (p.compensation.defined()) out.push_back(p.compensation);
  return out;
}

std::optional<LostUpdateReport> PureBf16::lost_updates() const {
  if (params_.empty()) return std::nullopt;
  LostUpdateReport r;
  r.rule = weight_update_name(rule_);
  r.keeps_dropped = rule_ != WeightUpdate::kNearest;
  LostUpdates total;
  for (const auto& p : params_) total += p.total;
  r.intended = total.intended;
  r.lost = total.lost;
  r.fraction = total.fraction();
  r.norm_ratio = total.norm_ratio();
  // An epoch that took no update (a replayed window that begins at an epoch's end) says nothing.
  for (const auto& e : per_epoch_)
    if (e.intended > 0) r.fraction_per_epoch.push_back(e.fraction());
  if (epoch_now_.intended > 0) r.fraction_per_epoch.push_back(epoch_now_.fraction());
  std::vector<LostUpdateReport::Param> rows;
  for (const auto& p : params_) {
    r.per_param.push_back({p.name, p.total.intended, p.total.lost});
    if (p.total.intended == 0) continue;
    LostUpdateReport::Param row;
    row.name = p.name;
    row.numel = p.weight.numel();
    row.fraction = p.total.fraction();
    row.never_moved = p.total.lost == p.total.intended;
    row.mean_abs_weight = p.weight.abs().mean().item<double>();
    // The root mean square of the fp32 updates: the size a typical update had.
    row.rms_update = std::sqrt(p.total.intended_sq / static_cast<double>(std::max<int64_t>(1, p.total.intended)));
    rows.push_back(std::move(row));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.fraction > b.fraction; });
  if (rows.size() > 8) rows.resize(8);
  r.worst = std::move(rows);
  choose_islands(r);
  return r;
}

void PureBf16::choose_islands(LostUpdateReport& r) const {
  // A module is a candidate when one of its own trainable parameters never moved or lost
  // nearly every update (a norm's gain, while its bias moves): in fp32 it would learn. Norm layers first (their gains are small and often
  // never move in bf16), then the smallest, within the budget.
  struct Module {
    std::string name;
    int64_t numel = 0;
    bool norm = false, lost = false;
  };
  std::vector<Module> modules;
  for (const auto& p : params_) {
    r.params += p.weight.numel();
    const size_t dot = p.name.rfind('.');
    const std::string name = dot == std::string::npos ? std::string() : p.name.substr(0, dot);
    auto m = std::find_if(modules.begin(), modules.end(), [&](const Module& x) { return x.name == name; });
    if (m == modules.end()) m = modules.insert(modules.end(), Module{name});
    m->numel += p.weight.numel();
    m->norm = m->norm || p.in_norm_layer;
    m->lost = m->lost || (p.total.intended > 0 && p.total.fraction() >= kIslandLostShare);
  }
  modules.erase(std::remove_if(modules.begin(), modules.end(), [](const Module& m) { return m.name.empty() || !m.lost; }),
                modules.end());
  std::stable_sort(modules.begin(), modules.end(),
                   [](const Module& a, const Module& b) { return a.norm != b.norm ? a.norm : a.numel < b.numel; });
  // A share of the model, or a few thousand elements, whichever is more (a small model's
  // norm is a large share of it, but still a few KiB).
  const int64_t budget = std::max(static_cast<int64_t>(kIslandBudget * static_cast<double>(r.params)), kIslandBudgetElements);
  for (const auto& m : modules) {
    if (r.island_params + m.numel > budget) continue;
    r.islands.push_back(m.name);
    r.island_params += m.numel;
  }
  // fp32 instead of bf16: 2 more bytes for the weight, 2 for its gradient, 2 per state tensor.
  r.island_extra_bytes = r.island_params * (4 + 2 * state_tensors_);
}

namespace {
std::vector<double> counts_of(const LostUpdates& c) {
  return {double(c.elements), double(c.intended), double(c.lost), c.intended_sq, c.lost_sq};
}
LostUpdates counts_from(const std::vector<double>& v, size_t at) {
  TORCH_CHECK(v.size() >= at + 5, "bf16-pure: the checkpoint's counts are damaged");
  LostUpdates c;
  c.elements = static_cast<int64_t>(v[at]);
  c.intended = static_cast<int64_t>(v[at + 1]);
  c.lost = static_cast<int64_t>(v[at + 2]);
  c.intended_sq = v[at + 3];
  c.lost_sq = v[at + 4];
  return c;
}
} // namespace

void PureBf16::restart_lost_updates() {
  for (auto& p : params_) p.total = LostUpdates();
  per_epoch_.clear();
  epoch_now_ = LostUpdates();
}

void PureBf16::save_state(torch::serialize::OutputArchive& ar) const {
  MixedPrecision::save_state(ar);
  ar.write("rule", c10::IValue(weight_update_name(rule_)));
  // The share lost per epoch: the epochs that ended, then the one in progress.
  std::vector<double> epochs;
  for (const auto& e : per_epoch_)
    for (double v : counts_of(e)) epochs.push_back(v);
  mixtrain::detail::write_f64s(ar, "epochs", epochs);
  mixtrain::detail::write_f64s(ar, "epoch_now", counts_of(epoch_now_));
  mixtrain::detail::write_i64(ar, "params", static_cast<int64_t>(params_.size()));
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    const std::string k = "param." + std::to_string(i) + ".";
    if (p.compensation.defined()) ar.write(k + "compensation", p.compensation);
    mixtrain::detail::write_f64s(ar, k + "total", counts_of(p.total));
  }
}

void PureBf16::load_state(torch::serialize::InputArchive& ar) {
  MixedPrecision::load_state(ar);
  c10::IValue rule;
  ar.read("rule", rule);
  TORCH_CHECK(rule.isString() && rule.toStringRef() == weight_update_name(rule_), "the checkpoint's bf16-pure weight update is ",
              rule.isString() ? rule.toStringRef() : std::string("unknown"), ", this run's is ", weight_update_name(rule_));
  const int64_t n = mixtrain::detail::read_i64(ar, "params");
  std::vector<Param> params(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Param& p = params[static_cast<size_t>(i)];
    const std::string k = "param." + std::to_string(i) + ".";
    // On bf16 storage the optimizer's archive holds it instead.
    if (rule_ == WeightUpdate::kKahan) ar.try_read(k + "compensation", p.compensation);
    const auto t = mixtrain::detail::read_f64s(ar, k + "total");
    TORCH_CHECK(t.size() == 5, "bf16-pure: the checkpoint's counts are damaged");
    p.total = counts_from(t, 0);
  }
  torch::Tensor epochs;
  if (ar.try_read("epochs", epochs)) {  // older checkpoints kept only the totals
    const auto v = mixtrain::detail::read_f64s(ar, "epochs");
    TORCH_CHECK(v.size() % 5 == 0, "bf16-pure: the checkpoint's counts are damaged");
    per_epoch_.clear();
    for (size_t at = 0; at < v.size(); at += 5) per_epoch_.push_back(counts_from(v, at));
    epoch_now_ = counts_from(mixtrain::detail::read_f64s(ar, "epoch_now"), 0);
    resumed_ = true;
  }
  // prepare() at the next fit takes them over, matched by position.
  params_ = std::move(params);
  prepared_for_module_ = nullptr;
}

} // namespace mixtrain::amp
