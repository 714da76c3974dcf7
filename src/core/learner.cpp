#include "mixtrain/core/learner.h"

#include "mixtrain/callbacks/progress.h"
#include "mixtrain/util/host_read.h"
#include "mixtrain/util/malloc_settings.h"
#include "mixtrain/models/failure_site.h"
#include "mixtrain/models/norm_layer.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/util/option_error.h"

#include <torch/csrc/jit/runtime/jit_exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <unordered_set>

namespace mixtrain {

OptimizerFactory adamw(double beta1, double beta2, double eps, double weight_decay) {
  return optimizer(OptimizerSettings().kind(OptimizerKind::kAdamW).mom(beta1).sqr_mom(beta2).eps(eps).wd(weight_decay));
}

OptimizerFactory sgd(double momentum, double weight_decay) {
  return optimizer(OptimizerSettings().kind(OptimizerKind::kSgd).mom(momentum).wd(weight_decay));
}

namespace {

/// Whether a kernel's error is about mixed dtypes ("expected scalar type BFloat16
/// but found Float", "self (Float) and source (BFloat16) must have the same scalar
/// type"): the errors a real bf16 autocast causes where it lacks a rule.
bool names_a_dtype_mismatch(const std::string& message) {
  for (const char* word : {"scalar type", "dtype", "BFloat16", "bfloat16", "Half"})
    if (message.find(word) != std::string::npos) return true;
  return false;
}

/// Collects predictions and targets during a validation pass (for get_preds).
class GatherPreds : public Callback {
 public:
  GatherPreds() { order = 100; }
  void after_batch(Learner& learn) override {
    if (learn.training()) return;
    preds.push_back(learn.pred().detach());
    targets.push_back(learn.batch().y);
  }
  std::vector<torch::Tensor> preds, targets;
};

} // namespace

Learner::Learner(Model model, data::DataLoaders dls, LossFn loss_fn, LearnerOptions options)
    : model_(std::move(model)), dls_(std::move(dls)), loss_fn_(std::move(loss_fn)), options_(std::move(options)) {
  TORCH_CHECK(model_.ptr(), "Learner needs a model");
  TORCH_CHECK(loss_fn_, "Learner needs a loss function");
  TORCH_CHECK(options_.opt_func(), "Learner needs an optimizer factory (opt_func)");
  settle_malloc_for_training();  // each step's activations from the heap, not mapped afresh
  model_.module().to(options_.device());
  groups_ = make_groups();
  recorder_ = std::make_shared<Recorder>(options_.metrics());
  recorder_->order = 50;
  add_cb(recorder_);
  if (options_.progress()) add_cb(std::make_shared<callbacks::ProgressCallback>());
}

namespace {

/// Weight decay 0 in `o`, for the optimizers libtorch ships; false for another type.

/// The parameters of `model` that `pick(module, name)` chooses, by identity;
/// `name` is the parameter's name within its own module ("weight", "bias").
std::unordered_set<const void*> params_where(torch::nn::Module& model,
                                             const std::function<bool(const torch::nn::Module&, const std::string&)>& pick) {
  std::unordered_set<const void*> out;
  for (const auto& m : model.modules(/*include_self=*/true))
    for (const auto& kv : m->named_parameters(/*recurse=*/false))
      if (pick(*m, kv.key())) out.insert(kv.value().unsafeGetTensorImpl());
  return out;
}

} // namespace

ParamGroups Learner::make_groups() {
  ParamGroups groups;
  if (options_.splitter()) {
    groups = options_.splitter()(model_.module());
  } else {
    // One group of every parameter, a tied one (two modules holding one tensor) once.
    std::unordered_set<const void*> listed;
    groups.emplace_back();
    for (const auto& p : model_.module().parameters())
      if (listed.insert(p.unsafeGetTensorImpl()).second) groups.back().push_back(p);
  }
  TORCH_CHECK(!groups.empty(), "the splitter made no parameter groups");
  std::unordered_set<const void*> seen;
  for (size_t g = 0; g < groups.size(); ++g) {
    TORCH_CHECK(!groups[g].empty(), "the splitter made an empty parameter group (group ", g, ")");
    for (const auto& p : groups[g])
      TORCH_CHECK(seen.insert(p.unsafeGetTensorImpl()).second, "the splitter put a parameter in two groups (again in group ",
                  g, ")");
  }
  return groups;
}

torch::optim::Optimizer& Learner::opt() {
  if (opt_) return *opt_;
  // Every parameter of a group is in the optimizer, frozen or not: a parameter
  // without a gradient is left alone by it, and unfreezing needs nothing more.
  std::vector<torch::Tensor> all;
  for (const auto& g : groups_) all.insert(all.end(), g.begin(), g.end());
  auto opt = options_.opt_func()(all, kDefaultLr);
  TORCH_CHECK(opt, "opt_func returned no optimizer");
  if (opt->param_groups().size() != 1) {
    // An optimizer that makes its own groups is kept as built.
    TORCH_CHECK(groups_.size() == 1, "opt_func built ", opt->param_groups().size(),
                " param groups; with a splitter it must build one (mixtrain makes one per parameter group)");
    group_of_opt_group_.assign(opt->param_groups().size(), 0);
    opt_ = std::move(opt);
    return *opt_;
  }
  // fastai's wd_bn_bias=False: norm layers' parameters and every bias without
  // weight decay (fastai's norm_bias_params), in an optimizer group of their own.
  std::unordered_set<const void*> undecayed_params;
  if (!options_.wd_bn_bias())
    undecayed_params = params_where(model_.module(), [](const torch::nn::Module& m, const std::string& name) {
      return is_norm_layer(m) || name == "bias";
    });
  const auto& decayed_options = opt->param_groups()[0].options();
  auto undecayed_options = decayed_options.clone();
  const bool split_decay = !undecayed_params.empty() && zero_weight_decay(*undecayed_options);
  std::vector<torch::optim::OptimizerParamGroup> built;
  group_of_opt_group_.clear();
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<torch::Tensor> decay, no_decay;
    for (const auto& p : groups_[g])
      (split_decay && undecayed_params.count(p.unsafeGetTensorImpl()) ? no_decay : decay).push_back(p);
    if (!decay.empty()) {
      built.emplace_back(decay, decayed_options.clone());
      group_of_opt_group_.push_back(static_cast<int64_t>(g));
    }
    if (!no_decay.empty()) {
      built.emplace_back(no_decay, undecayed_options->clone());
      group_of_opt_group_.push_back(static_cast<int64_t>(g));
    }
  }
  // Adagrad makes its state in its constructor, and add_param_group refuses a parameter
  // that has state: the state is set aside while the groups are rebuilt (its step needs it).
  auto state = std::move(opt->state());
  opt->state().clear();
  opt->param_groups().clear();
  for (auto& group : built) opt->add_param_group(group);
  opt->state() = std::move(state);
  opt_ = std::move(opt);
  return *opt_;
}

void Learner::set_lrs(const std::vector<double>& lrs) {
  auto& groups = opt().param_groups();
  TORCH_CHECK(static_cast<int64_t>(lrs.size()) == n_groups(), "set_lrs: got ", lrs.size(),
              " learning rates but the model has ", n_groups(), " parameter groups");
  TORCH_CHECK(group_of_opt_group_.size() == groups.size(), "the optimizer has ", groups.size(),
              " param groups, not the ", group_of_opt_group_.size(), " the Learner made (set_opt must keep them)");
  for (size_t i = 0; i < groups.size(); ++i)
    groups[i].options().set_lr(lrs[static_cast<size_t>(group_of_opt_group_[i])]);
}

std::vector<double> Learner::group_lrs() {
  auto& groups = opt().param_groups();
  std::vector<double> lrs(static_cast<size_t>(n_groups()), std::numeric_limits<double>::quiet_NaN());
  for (size_t i = 0; i < groups.size() && i < group_of_opt_group_.size(); ++i)
    lrs[static_cast<size_t>(group_of_opt_group_[i])] = groups[i].options().get_lr();
  return lrs;
}

void Learner::freeze_to(int64_t n) {
  const int64_t count = n_groups();
  TORCH_CHECK(n > -count && n < count, "freeze_to(", n, "): the model has ", count, " parameter group",
              count == 1 ? "" : "s", ", so n must be in [", 1 - count, ", ", count - 1,
              "] (at least the last group trains)");
  const int64_t idx = n < 0 ? count + n : n;
  std::unordered_set<const void*> norm_params;
  if (options_.train_bn())
    norm_params = params_where(model_.module(), [](const torch::nn::Module& m, const std::string&) { return is_norm_layer(m); });
  for (int64_t g = 0; g < count; ++g)
    for (auto& p : groups_[static_cast<size_t>(g)]) {
      const bool trains = g >= idx || norm_params.count(p.unsafeGetTensorImpl()) > 0;
      p.set_requires_grad(trains);
      // A zeroed gradient would still be stepped (momentum, weight decay): a
      // frozen parameter has none.
      if (!trains) p.mutable_grad() = torch::Tensor();
    }
  frozen_idx_ = idx;
}

void Learner::fine_tune(int64_t epochs, double base_lr, int64_t freeze_epochs, double lr_mult) {
  TORCH_CHECK(freeze_epochs >= 0, "fine_tune: freeze_epochs must be >= 0, got ", freeze_epochs);
  TORCH_CHECK(lr_mult >= 1 && std::isfinite(lr_mult), "fine_tune: lr_mult must be >= 1, got ", lr_mult);
  if (freeze_epochs > 0) {
    TORCH_CHECK(n_groups() > 1, "fine_tune: the model has one parameter group, so there is nothing to freeze; ",
                "give LearnerOptions a splitter (e.g. split_at) or pass freeze_epochs 0");
    freeze();
    fit_one_cycle(freeze_epochs, lr_slice(base_lr), OneCycleOptions().pct_start(0.99));
  }
  base_lr /= 2;
  unfreeze();
  fit_one_cycle(epochs, lr_slice(base_lr / lr_mult, base_lr), OneCycleOptions().pct_start(0.3).div(5.0));
}

Learner& Learner::add_cb(CallbackPtr cb) {
  TORCH_CHECK(cb, "add_cb: null callback");
  // upper_bound keeps insertion order among callbacks of equal order.
  auto pos = std::upper_bound(cbs_.begin(), cbs_.end(), cb->order,
                              [](int order, const CallbackPtr& c) { return order < c->order; });
  cbs_.insert(pos, std::move(cb));
  return *this;
}

Learner& Learner::remove_cb(const CallbackPtr& cb) {
  cbs_.erase(std::remove(cbs_.begin(), cbs_.end(), cb), cbs_.end());
  return *this;
}

double Learner::pct_train() const {
  const int64_t total = n_epoch_ * dls_.train.num_batches();
  return total > 0 ? static_cast<double>(train_iter_) / total : 0.0;
}

void Learner::run(Event event) {
  // Copy: a callback may add or remove callbacks while handling an event.
  const std::vector<CallbackPtr> cbs = cbs_;
  for (const auto& cb : cbs) cb->handle(event, *this);
}

template <typename Cancel, typename F>
void Learner::with_events(F&& body, Event before, Event after_cancel, Event after) {
  // As fastai's _with_events: the before_ event is inside the try, and after_
  // fires whether or not the stage was cancelled.
  try {
    run(before);
    body();
  } catch (const Cancel&) {
    run(after_cancel);
  }
  run(after);
}

template <typename F>
void Learner::releasing_on_error(F&& body) {
  try {
    body();
  } catch (...) {
    for (const auto& cb : cbs_) {
      try {
        cb->on_error(*this);
      } catch (...) {
        // The first error is the one the caller needs to see.
      }
    }
    throw;
  }
}

void Learner::fit(int64_t n_epoch, Lrs lr, std::vector<CallbackPtr> cbs) {
  TORCH_CHECK(n_epoch > 0, "Invalid n_epoch: ", n_epoch, " (must be > 0)");
  const std::vector<double> lrs = lr.for_groups(n_groups());
  TORCH_CHECK(dls_.train.num_batches() > 0, "The training set has no full batch (", dls_.train.dataset().size(),
              " samples, batch size ", dls_.train.options().batch_size(), ")");
  for (const auto& cb : cbs) add_cb(cb);
  // Detach the fit-only callbacks however fit ends.
  struct Detach {
    Learner* l;
    std::vector<CallbackPtr>& cbs;
    ~Detach() { for (const auto& cb : cbs) l->remove_cb(cb); }
  } detach{this, cbs};
  set_lrs(lrs);
  n_epoch_ = n_epoch;
  train_iter_ = 0;
  resume_.active.reset();
  if (resume_.pending) {
    const ResumeState::Pending r = *resume_.pending;
    resume_.pending.reset();
    TORCH_CHECK(r.n_epoch == n_epoch, "The checkpoint was taken in a fit of ", r.n_epoch,
                " epochs; resume it with the same number of epochs (got ", n_epoch, ")");
    train_iter_ = r.train_iter;
    resume_.active = r.at;
  }
  releasing_on_error([&] {
    with_events<CancelFitException>([&] { do_fit(); }, Event::before_fit, Event::after_cancel_fit, Event::after_fit);
  });
}

void Learner::fit_one_cycle(int64_t n_epoch, Lrs lr_max, OneCycleOptions options, std::vector<CallbackPtr> cbs) {
  const std::vector<double> peaks = lr_max.for_groups(n_groups());
  std::vector<Schedule> lr_scheds;
  for (double peak : peaks) lr_scheds.push_back(one_cycle_lr(peak, options));
  cbs.push_back(std::make_shared<ParamScheduler>(std::map<std::string, std::vector<Schedule>>{
      {"lr", std::move(lr_scheds)}, {"mom", {one_cycle_mom(options)}}}));
  fit(n_epoch, Lrs(peaks), std::move(cbs));
}

void Learner::do_fit() {
  for (epoch_ = resume_.active ? resume_.active->epoch : 0; epoch_ < n_epoch_; ++epoch_)
    with_events<CancelEpochException>([&] { do_epoch(); }, Event::before_epoch, Event::after_cancel_epoch,
                                      Event::after_epoch);
}

void Learner::do_epoch() {
  training_ = true;
  model_.module().train();
  with_events<CancelTrainException>([&] { all_batches(dls_.train); }, Event::before_train, Event::after_cancel_train,
                                    Event::after_train);
  resume_.active.reset();
  do_validate_epoch();
  resume_.now.epoch = epoch_ + 1;
  resume_.now.batch = 0;
}

void Learner::do_validate_epoch() {
  training_ = false;
  model_.module().eval();
  torch::NoGradGuard no_grad;
  with_events<CancelValidateException>([&] { all_batches(dls_.valid); }, Event::before_validate,
                                       Event::after_cancel_validate, Event::after_validate);
}

void Learner::all_batches(data::DataLoader& dl) {
  n_iter_ = dl.num_batches();
  int64_t first = 0;
  if (training_) {
    if (resume_.active) {
      // Same permutation as the interrupted epoch; skip the batches it finished.
      dl.generator().set_state(resume_.active->loader_state);
      first = resume_.active->batch;
    }
    resume_.now.loader_state = dl.generator().get_state();
  }
  int64_t i = 0;
  for (auto it = dl.begin(), end = dl.end(); it != end; ++it, ++i)
    if (i >= first) one_batch(i, *it);
}

void Learner::one_batch(int64_t i, const data::Batch& b) {
  iter_ = i;
  step_info_ = StepInfo();
  loss_value_of_ = torch::Tensor();
  const bool on_cpu = options_.device().is_cpu();
  batch_ = on_cpu ? b : b.to(options_.device());
  try {
    run(Event::before_batch);
    do_one_batch();
  } catch (const CancelBatchException&) {
    run(Event::after_cancel_batch);
  }
  // Counted before after_batch (as fastai's TrainEvalCallback), so a checkpoint
  // taken in after_batch resumes after this batch.
  if (training_) {
    ++train_iter_;
    resume_.now.epoch = epoch_;
    resume_.now.batch = i + 1;
  }
  run(Event::after_batch);
}

void Learner::do_one_batch() {
  const ModelInputs inputs = model_.inputs_for(batch_);
  try {
    pred_ = model_.forward(inputs);
  } catch (const OptionError&) {
    throw;  // an option that does not fit what the model returns: it names itself
  } catch (const std::exception& e) {
    // libtorch's errors, and TorchScript's: a `raise` in the model is a JITException, a
    // kernel's error inside a script a runtime_error that starts with the interpreter's
    // header. A C++ model's own exception types pass as they are: their caller may catch them.
    const bool from_script = std::string(e.what()).rfind("The following operation failed in the TorchScript interpreter", 0) == 0;
    if (!dynamic_cast<const c10::Error*>(&e) && !dynamic_cast<const torch::jit::JITException*>(&e) && !from_script) throw;
    // The error names neither the op nor the module (a TorchScript model's says
    // only "The following operation failed in the TorchScript interpreter"): the
    // forward runs once more, watched, to say where. Not for a lack of memory,
    // which a second forward would only meet again.
    const std::string cause = innermost_message(e);
    if (cause.find("out of memory") != std::string::npos) throw;
    const std::string place = failure_place(e, [&] { (void)model_.forward(inputs); });
    const std::string failure = (place.empty() ? "" : place + ": ") + cause;  // "in layers.1 (aten::linear): ..."
    // A real reduced-precision path that cannot run this model falls back to the
    // emulation (which computes every op in fp32) instead of ending the fit: only for
    // a kernel's dtype error, which is what the real path causes. The model's own
    // raise (a JITException) or check is the model speaking, and ends the fit.
    const auto pc = precision_cb();
    const bool dtype_error = !dynamic_cast<const torch::jit::JITException*>(&e) && names_a_dtype_mismatch(cause);
    if (!pc || !dtype_error || !pc->retry_forward_emulated(*this, [&] { pred_ = model_.forward(inputs); }, failure))
      TORCH_CHECK(false, "the model's forward failed", place.empty() ? ": " : " ", failure);
  }
  run(Event::after_pred);
  loss_grad_ = loss_fn_(pred_, batch_.y);
  loss_ = loss_grad_.detach().clone();
  run(Event::after_loss);
  if (!training_) return;
  with_events<CancelBackwardException>([&] { loss_grad_.backward(); }, Event::before_backward,
                                       Event::after_cancel_backward, Event::after_backward);
  with_events<CancelStepException>([&] { opt_->step(); }, Event::before_step, Event::after_cancel_step,
                                   Event::after_step);
  opt_->zero_grad();
}

double Learner::loss_value() {
  TORCH_CHECK(loss_.defined(), "Learner::loss_value: no loss in this batch yet");
  if (!loss_value_of_.is_same(loss_)) provide_loss_value(read_to_host({loss_}).at(0));
  return loss_value_;
}

void Learner::provide_loss_value(double value) {
  loss_value_ = value;
  loss_value_of_ = loss_;
}

std::vector<double> Learner::validate() {
  n_epoch_ = std::max<int64_t>(n_epoch_, 1);
  releasing_on_error([&] { do_validate_epoch(); });
  return recorder_->last_validation();
}

std::pair<torch::Tensor, torch::Tensor> Learner::get_preds() {
  auto gather = std::make_shared<GatherPreds>();
  add_cb(gather);
  try {
    releasing_on_error([&] { do_validate_epoch(); });
  } catch (...) {
    remove_cb(gather);
    throw;
  }
  remove_cb(gather);
  if (gather->preds.empty()) return {};
  return {torch::cat(gather->preds), torch::cat(gather->targets)};
}

std::pair<torch::Tensor, torch::Tensor> Learner::get_preds(const data::DataLoader& loader) {
  // The validation pass over `loader`: the same events (precision, emulation), then the valid loader back.
  data::DataLoader valid = loader;
  std::swap(dls_.valid, valid);
  try {
    auto preds = get_preds();
    std::swap(dls_.valid, valid);
    return preds;
  } catch (...) {
    std::swap(dls_.valid, valid);
    throw;
  }
}

} // namespace mixtrain
