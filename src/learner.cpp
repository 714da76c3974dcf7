#include "mixtrain/learner.h"

#include "mixtrain/callbacks/progress.h"
#include "mixtrain/models.h"

#include <torch/nn/functional/loss.h>
#include <torch/optim.h>
#include <torch/utils.h>

#include <zlib.h>

#include <algorithm>
#include <sstream>

namespace mixtrain {

OptimizerFactory adamw(double beta1, double beta2, double eps, double weight_decay) {
  return [=](const std::vector<torch::Tensor>& params, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay));
  };
}

OptimizerFactory sgd(double momentum, double weight_decay) {
  return [=](const std::vector<torch::Tensor>& params, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(lr).momentum(momentum).weight_decay(weight_decay));
  };
}

namespace {

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

/// "the model's output [64, 10] does not fit the targets [64, 3] for mse".
std::string misfit(const torch::Tensor& pred, const torch::Tensor& target, const char* loss) {
  return "the model's output " + shape_of(pred) + " does not fit the targets " + shape_of(target) + " for " + loss;
}

} // namespace

LossFn cross_entropy() {
  return [](const torch::Tensor& pred, const torch::Tensor& target) {
    TORCH_CHECK(!target.is_floating_point() && !target.is_complex(), "cross_entropy needs integer class targets, got ",
                target.scalar_type(), " targets (for regression use mse, for 0/1 labels bce_with_logits)");
    const auto p = pred.sizes(), t = target.sizes();
    // Sequence outputs [N, T, C] against [N, T]: classes on the last dim.
    if (pred.dim() >= 3 && pred.dim() == target.dim() + 1 && p.slice(0, p.size() - 1) == t)
      return torch::nn::functional::cross_entropy(pred.reshape({-1, pred.size(-1)}), target.reshape({-1}));
    // torch's own layout: [N, C] against [N], [N, C, d...] against [N, d...].
    const bool torch_layout = pred.dim() >= 2 && pred.dim() == target.dim() + 1 && p[0] == t[0] &&
                              p.slice(2) == t.slice(1);
    TORCH_CHECK(torch_layout, misfit(pred, target, "cross_entropy"),
                " (it takes logits [N, C] with targets [N], or [N, T, C] with [N, T])");
    return torch::nn::functional::cross_entropy(pred, target);
  };
}

LossFn mse() {
  return [](const torch::Tensor& pred, const torch::Tensor& target) {
    TORCH_CHECK(target.is_floating_point(), "mse needs float targets, got ", target.scalar_type(),
                " targets (for class labels use cross_entropy)");
    const bool column = pred.dim() == 2 && pred.size(1) == 1 && target.dim() == 1 && pred.size(0) == target.size(0);
    TORCH_CHECK(column || pred.sizes() == target.sizes(), misfit(pred, target, "mse"), " (they need the same shape)");
    return torch::mse_loss(column ? pred.squeeze(1) : pred, target.to(pred.scalar_type()));
  };
}

LossFn bce_with_logits() {
  return [](const torch::Tensor& pred, const torch::Tensor& target) {
    const bool column = pred.dim() == 2 && pred.size(1) == 1 && target.dim() == 1 && pred.size(0) == target.size(0);
    TORCH_CHECK(column || pred.sizes() == target.sizes(), misfit(pred, target, "bce_with_logits"),
                " (they need the same shape)");
    return torch::binary_cross_entropy_with_logits(column ? pred.squeeze(1) : pred, target.to(pred.scalar_type()));
  };
}

LossFn loss_by_name(const std::string& name) {
  if (name == "cross_entropy") return cross_entropy();
  if (name == "mse") return mse();
  if (name == "bce_with_logits") return bce_with_logits();
  TORCH_CHECK(false, "Unknown loss '", name, "' (choices: cross_entropy, mse, bce_with_logits)");
}

Model::Model(std::shared_ptr<torch::nn::Module> module, Forward forward, int64_t num_inputs)
    : module_(std::move(module)), forward_(std::move(forward)), num_inputs_(num_inputs) {
  TORCH_CHECK(module_ && forward_, "Model needs a module and a forward function");
}

torch::Tensor Model::forward(const ModelInputs& inputs) const {
  TORCH_CHECK(num_inputs_ < 0 || static_cast<int64_t>(inputs.size()) == num_inputs_, "The model's forward takes ",
              num_inputs_, " input", num_inputs_ == 1 ? "" : "s", " but the data has ", inputs.size());
  return forward_(inputs);
}

namespace {

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

std::vector<torch::Tensor> Model::state_tensors() const {
  std::vector<torch::Tensor> state;
  for (const auto& p : module_->parameters()) state.push_back(p.detach());
  for (const auto& b : module_->buffers()) state.push_back(b.detach());
  return state;
}

uint32_t Model::state_crc32() const {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& t : state_tensors()) {
    const torch::Tensor c = t.to(torch::kCPU).contiguous();
    crc = crc32(crc, static_cast<const Bytef*>(c.data_ptr()), static_cast<uInt>(c.nbytes()));
  }
  return static_cast<uint32_t>(crc);
}

Learner::Learner(Model model, data::DataLoaders dls, LossFn loss_fn, LearnerOptions options)
    : model_(std::move(model)), dls_(std::move(dls)), loss_fn_(std::move(loss_fn)), options_(std::move(options)) {
  TORCH_CHECK(model_.ptr(), "Learner needs a model");
  TORCH_CHECK(loss_fn_, "Learner needs a loss function");
  TORCH_CHECK(options_.opt_func(), "Learner needs an optimizer factory (opt_func)");
  model_.module().to(options_.device());
  recorder_ = std::make_shared<Recorder>(options_.metrics());
  recorder_->order = 50;
  add_cb(recorder_);
  if (options_.progress()) add_cb(std::make_shared<callbacks::ProgressCallback>());
}

namespace {

/// Weight decay 0 in `o`, for the optimizers libtorch ships; false for another type.
bool zero_weight_decay(torch::optim::OptimizerOptions& o) {
  namespace optim = torch::optim;
  if (auto* a = dynamic_cast<optim::AdamWOptions*>(&o)) return a->weight_decay(0), true;
  if (auto* a = dynamic_cast<optim::AdamOptions*>(&o)) return a->weight_decay(0), true;
  if (auto* a = dynamic_cast<optim::SGDOptions*>(&o)) return a->weight_decay(0), true;
  if (auto* a = dynamic_cast<optim::RMSpropOptions*>(&o)) return a->weight_decay(0), true;
  if (auto* a = dynamic_cast<optim::AdagradOptions*>(&o)) return a->weight_decay(0), true;
  return false;
}

} // namespace

torch::optim::Optimizer& Learner::opt() {
  if (opt_) return *opt_;
  std::vector<torch::Tensor> params, decay, no_decay;
  for (const auto& p : model_.module().parameters())
    if (p.requires_grad()) params.push_back(p);
  opt_ = options_.opt_func()(params, kDefaultLr);
  TORCH_CHECK(opt_, "opt_func returned no optimizer");
  if (options_.wd_bn_bias() || opt_->param_groups().size() != 1) return *opt_;
  // fastai's wd_bn_bias=False: norm layers' parameters and every bias in a group
  // without weight decay (fastai's norm_bias_params).
  for (const auto& m : model_.module().modules(/*include_self=*/true))
    for (const auto& kv : m->named_parameters(/*recurse=*/false))
      if (kv.value().requires_grad()) (is_norm_layer(*m) || kv.key() == "bias" ? no_decay : decay).push_back(kv.value());
  if (no_decay.empty()) return *opt_;
  auto decayed = opt_->param_groups()[0].options().clone();
  auto undecayed = decayed->clone();
  if (!zero_weight_decay(*undecayed)) return *opt_;  // an optimizer we cannot configure: one group, as built
  opt_->param_groups().clear();
  if (!decay.empty()) opt_->add_param_group(torch::optim::OptimizerParamGroup(decay, std::move(decayed)));
  opt_->add_param_group(torch::optim::OptimizerParamGroup(no_decay, std::move(undecayed)));
  return *opt_;
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

void Learner::fit(int64_t n_epoch, double lr, std::vector<CallbackPtr> cbs) {
  TORCH_CHECK(n_epoch > 0, "Invalid n_epoch: ", n_epoch, " (must be > 0)");
  TORCH_CHECK(lr > 0, "Invalid lr: ", lr, " (must be > 0)");
  TORCH_CHECK(dls_.train.num_batches() > 0, "The training set has no full batch (", dls_.train.dataset().size(),
              " samples, batch size ", dls_.train.options().batch_size(), ")");
  for (const auto& cb : cbs) add_cb(cb);
  // Detach the fit-only callbacks however fit ends.
  struct Detach {
    Learner* l;
    std::vector<CallbackPtr>& cbs;
    ~Detach() { for (const auto& cb : cbs) l->remove_cb(cb); }
  } detach{this, cbs};
  set_lr(opt(), lr);
  n_epoch_ = n_epoch;
  train_iter_ = 0;
  start_epoch_ = 0;
  if (pending_resume_) {
    const ResumePoint r = *pending_resume_;
    pending_resume_.reset();
    TORCH_CHECK(r.n_epoch == n_epoch, "The checkpoint was taken in a fit of ", r.n_epoch,
                " epochs; resume it with the same number of epochs (got ", n_epoch, ")");
    train_iter_ = r.train_iter;
    start_epoch_ = r.epoch;
    resume_batch_ = r.batch;
    resume_loader_state_ = r.loader_state;
    resuming_ = true;
  }
  releasing_on_error([&] {
    with_events<CancelFitException>([&] { do_fit(); }, Event::before_fit, Event::after_cancel_fit, Event::after_fit);
  });
}

void Learner::fit_one_cycle(int64_t n_epoch, double lr_max, OneCycleOptions options, std::vector<CallbackPtr> cbs) {
  cbs.push_back(std::make_shared<ParamScheduler>(std::map<std::string, Schedule>{
      {"lr", one_cycle_lr(lr_max, options)}, {"mom", one_cycle_mom(options)}}));
  fit(n_epoch, lr_max, std::move(cbs));
}

void Learner::do_fit() {
  for (epoch_ = start_epoch_; epoch_ < n_epoch_; ++epoch_)
    with_events<CancelEpochException>([&] { do_epoch(); }, Event::before_epoch, Event::after_cancel_epoch,
                                      Event::after_epoch);
}

void Learner::do_epoch() {
  training_ = true;
  model_.module().train();
  with_events<CancelTrainException>([&] { all_batches(dls_.train); }, Event::before_train, Event::after_cancel_train,
                                    Event::after_train);
  resuming_ = false;
  do_validate_epoch();
  next_epoch_ = epoch_ + 1;
  next_batch_ = 0;
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
    if (resuming_) {
      // Same permutation as the interrupted epoch; skip the batches it finished.
      dl.generator().set_state(resume_loader_state_);
      first = resume_batch_;
    }
    epoch_loader_state_ = dl.generator().get_state();
  }
  int64_t i = 0;
  for (auto it = dl.begin(), end = dl.end(); it != end; ++it, ++i)
    if (i >= first) one_batch(i, *it);
}

void Learner::one_batch(int64_t i, const data::Batch& b) {
  iter_ = i;
  step_info_ = StepInfo();
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
    next_epoch_ = epoch_;
    next_batch_ = i + 1;
  }
  run(Event::after_batch);
}

void Learner::do_one_batch() {
  pred_ = model_.forward(batch_.inputs());
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
