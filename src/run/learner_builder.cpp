#include "mixtrain/run/learner_builder.h"

#include "util/first_line.h"
#include "mixtrain/amp/precision_options.h"
#include "mixtrain/callbacks/gradient_accumulation.h"
#include "mixtrain/diagnose/fit_warning.h"
#include "mixtrain/callbacks/gradient_clip.h"
#include "mixtrain/util/option_error.h"
#include "mixtrain/run/model_registry.h"
#include "mixtrain/models/scripted_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

namespace mixtrain::run {

namespace {

/// The data the configuration names: text for a text model, a tensor file, or Fashion-MNIST.
data::DatasetSplit read_data(const RunConfig& r) {
  namespace fs = std::filesystem;
  const BuiltinModel* builtin = find_builtin_model(r.model);
  if (builtin && builtin->data == DataKind::kText) return data::text_corpus(r.data.empty() ? builtin->default_data : r.data);
  if (!r.data.empty() && fs::is_regular_file(r.data)) return data::load_tensor_file(r.data, r.seed);
  if (!r.data.empty() && !fs::is_directory(r.data))
    throw OptionError("data", Phrase::name("data") + " " + r.data + " is neither a directory (Fashion-MNIST) nor a file (torch.save)");
  return data::fashion_mnist(r.data.empty() ? (builtin ? builtin->default_data : data::kFashionMnistDir) : r.data);
}

/// parameter groups (the splitter runs in the Learner's constructor, so a bad
/// name is an error before training), the lr count against them, and freeze_to.
void apply_param_groups(const RunConfig& r, Learner& learn) {
  const int64_t groups = learn.n_groups();
  try {
    r.lr.for_groups(groups);
  } catch (const c10::Error& e) {
    throw OptionError("lr", Phrase::setting("lr", r.lr.str()) + ": " + e.msg() +
                                (r.split_at.empty() ? " (" + Phrase::name("split_at") + " makes groups)" : Phrase()));
  }
  if (r.freeze_to == 0) return;
  if (r.freeze_to < 0 || r.freeze_to >= groups)
    throw OptionError("freeze_to", "invalid " + Phrase::setting("freeze_to", std::to_string(r.freeze_to)) + ": " +
                                       Phrase::setting("split_at", r.split_at) + " makes " + std::to_string(groups) +
                                       " parameter groups, so it must be in [0, " + std::to_string(groups - 1) +
                                       "] (the last group always trains)");
  learn.freeze_to(r.freeze_to);
}

} // namespace

data::DatasetSplit load_split(const RunArgs& a, int world_size) {
  const RunConfig& r = a.config;
  auto split = a.data_source ? *a.data_source : read_data(r);
  if (r.limit > 0) split.train = split.train.head(r.limit);
  // Under data parallelism every rank gets its shard of the training set.
  const int64_t per_rank = split.train.size() / std::max(1, world_size);
  const std::string each = world_size > 1 ? ", " + std::to_string(per_rank) + " per rank of " + std::to_string(world_size) : "";
  if (per_rank < r.bs)
    throw OptionError("bs", "the training set (" + std::to_string(split.train.size()) + " samples" + each +
                                ") is smaller than " + Phrase::setting("bs", std::to_string(r.bs)) + ": no full batch to train on");
  if (r.accum > per_rank / r.bs)
    throw OptionError("accum", Phrase::setting("accum", std::to_string(r.accum)) + " is more than the " +
                                   std::to_string(per_rank / r.bs) + " batches of an epoch" +
                                   (each.empty() ? "" : " (" + each.substr(2) + ")") + ": no optimizer step would run");
  TORCH_CHECK(split.valid.size() > 0, "the validation set is empty");
  return split;
}

ThreadPolicy thread_policy(const RunConfig& r) {
  if (r.thread_policy) return *r.thread_policy;
  const BuiltinModel* builtin = find_builtin_model(r.model);
  return builtin ? builtin->threads : ThreadPolicy::kIntraOp;
}

Model build_model(const RunConfig& r) {
  const BuiltinModel* builtin = find_builtin_model(r.model);
  if (builtin && r.loss == LossKind::kModel)
    throw OptionError("loss", Phrase::setting("loss", "model") + " is for a TorchScript model that computes its loss; the built-in " +
                                  r.model + " does not (" + Phrase::name("loss") + " cross_entropy, mse or bce_with_logits)");
  return builtin ? builtin->build() : load_scripted_model(r.model, r.output, r.loss == LossKind::kModel);
}

Model build_model(const RunArgs& a) { return a.model_source ? a.model_source(a.config) : build_model(a.config); }

bool is_sequence_classification(const data::DatasetSplit& split, const RunConfig& r) {
  const torch::Tensor& y = split.train.y;
  return r.loss == LossKind::kCrossEntropy && y.defined() && y.dim() == 2 && !y.is_floating_point();
}

std::vector<Metric> metrics_for(const RunConfig& r, const data::DatasetSplit& split, const torch::Tensor& prediction) {
  if (r.loss == LossKind::kModel) {
    // A model's own loss says nothing about its targets; accuracy where the
    // prediction is class scores [N, C] for class targets [N]. (A language model
    // that shifts its labels inside would be misjudged by accuracy or perplexity
    // on its logits; the validation loss says it.)
    const torch::Tensor& y = split.train.y;
    if (prediction.defined() && prediction.dim() == 2 && y.defined() && y.dim() == 1 && !y.is_floating_point())
      return {accuracy()};
    return {};
  }
  if (is_sequence_classification(split, r)) return {accuracy(), perplexity()};
  if (r.loss == LossKind::kCrossEntropy) return {accuracy()};
  if (r.loss == LossKind::kBceWithLogits) return {binary_accuracy()};
  return {};  // mse: the validation loss says it
}

torch::Tensor check_model_fits_data(const Model& model, const LossFn& loss_fn, const data::Dataset& train) {
  const data::Batch probe = data::Batch::head_of(train, 2);
  torch::NoGradGuard no_grad;
  model.module().eval();
  torch::Tensor pred;
  try {
    pred = model.forward(model.inputs_for(probe));
    if (pred.is_floating_point()) pred = pred.to(torch::kFloat);
    loss_fn(pred, probe.y);
  } catch (const OptionError&) {  // an option that does not fit the model (--output, --loss model): it names itself
    model.module().train();
    throw;
  } catch (const std::exception& e) {
    model.module().train();
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    // A Python caller gets a ValueError: it is the data (or the model) that is wrong, not the run.
    throw OptionError("data", Phrase("the model does not run on the data: " +
                                     detail::torch_error_cause(c10_error ? c10_error->what_without_backtrace() : e.what())));
  }
  model.module().train();
  return pred;
}

std::unique_ptr<Learner> build_learner(const RunArgs& a, const data::DatasetSplit& split, bool progress) {
  const RunConfig& r = a.config;
  Model model = build_model(a);
  LossFn loss = r.loss == LossKind::kModel ? model_loss(model) : loss_for(r.loss);
  const torch::Tensor probe = check_model_fits_data(model, loss, split.train);
  auto options = LearnerOptions().metrics(metrics_for(r, split, probe)).progress(progress).wd_bn_bias(r.wd_bn_bias);
  // A split point that names no layer is an OptionError("split_at") from the constructor (the splitter runs there).
  if (!r.split_at.empty()) options.splitter(split_at(split_names(r.split_at)));
  auto learn = std::make_unique<Learner>(std::move(model), data::DataLoaders::from_split(split, r.bs, r.seed),
                                         std::move(loss), options);
  apply_param_groups(r, *learn);
  // Orders 20 and 5: they run after / before the precision callbacks added later, whatever the insertion order.
  if (r.clip > 0) learn->add_cb(std::make_shared<callbacks::GradientClip>(r.clip));
  if (r.accum > 1) learn->add_cb(std::make_shared<callbacks::GradientAccumulation>(r.accum));
  return learn;
}

void set_precision(Learner& learn, const RunConfig& config) {
  // Stochastic rounding draws from the run's seed: the same seed gives the same run on every rank.
  learn.set_precision(config.precision, PrecisionOptions(config.precision_options).rounding_seed(config.seed));
  if (config.precision == Precision::kFp16 || config.precision == Precision::kBf16Pure)
    learn.add_cb(std::make_shared<diagnose::FitWarning>());
}

} // namespace mixtrain::run
