#include "mixtrain/run/learner_builder.h"

#include "mixtrain/run/stored_model.h"

#include "mixtrain/optim/optimizers.h"

#include "mixtrain/run/loop_state.h"

#include "mixtrain/amp/precision_options.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/callbacks/gradient_accumulation.h"
#include "mixtrain/diagnose/fit_warning.h"
#include "mixtrain/callbacks/gradient_clip.h"
#include "mixtrain/util/option_error.h"
#include "mixtrain/util/cpu_budget.h"
#include "mixtrain/util/threads.h"
#include "mixtrain/util/warnings.h"
#include "mixtrain/run/model_registry.h"
#include "mixtrain/models/failure_site.h"
#include "mixtrain/models/scripted_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

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

/// NaN or inf in the inputs trains nothing useful and says so only as a NaN loss
/// (or, in the validation set, a "valid loss nan" at the end): said before training.
void warn_nonfinite_inputs(const data::DatasetSplit& split) {
  for (const auto& [which, d] : {std::pair<const char*, const data::Dataset*>{"training", &split.train},
                                 {"validation", &split.valid}}) {
    int64_t bad = 0, values = 0;
    std::vector<torch::Tensor> inputs{d->x};
    inputs.insert(inputs.end(), d->extra_x.begin(), d->extra_x.end());
    for (const auto& x : inputs) {
      if (!x.defined() || !x.is_floating_point()) continue;
      bad += (~torch::isfinite(x)).sum().item<int64_t>();
      values += x.numel();
    }
    if (bad == 0) continue;
    warn(std::string("the ") + which + " inputs hold " + std::to_string(bad) + " NaN/inf value" + (bad == 1 ? "" : "s") +
         " (of " + std::to_string(values) + "): " +
         (std::string(which) == "training" ? "a batch holding one makes the loss NaN" : "the validation loss and metrics will be NaN"));
  }
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
  warn_nonfinite_inputs(split);
  return split;
}

RunStart start_run(const RunArgs& a, int world_size) {
  RunStart s;
  // "All cores" read once: the count set and the words saying why come from the same read.
  const CpuBudget budget = a.config.threads == 0 ? cpu_budget() : CpuBudget{};
  s.threads = configure_threads(a.config.threads == 0 ? budget.threads() : a.config.threads, thread_policy(a.config));
  if (a.config.threads == 0) s.threads_why = budget.why();
  torch::manual_seed(a.config.seed);
  s.split = load_split(a, world_size);
  return s;
}

std::string threads_words(const RunStart& start) {
  return std::to_string(start.threads) + " thread(s)" + (start.threads_why.empty() ? "" : " (" + start.threads_why + ")");
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
  if (builtin) return builtin->build();
  Model model = load_scripted_model(r.model, r.output, r.loss == LossKind::kModel);
  // The stored-model rule (choose_for_model_file chose the mode): fp16 weights are refused,
  // bf16 ones train their values in fp32 storage.
  refuse_fp16_storage(stored_model(*model.ptr()));
  widen_bf16_storage(*model.ptr());
  return model;
}

Model build_model(const RunArgs& a) {
  Model model = a.model_source ? a.model_source(a.config) : build_model(a.config);
  // A model file's or a front end's model: what libtorch would report deep inside the run,
  // said first (Python asks the same rule before it scripts the model: run/stored_model.h).
  refuse_untrainable(*model.ptr());
  return model;
}

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

void check_class_targets(const RunConfig& r, const torch::Tensor& probe, const data::DatasetSplit& split) {
  if (r.loss != LossKind::kCrossEntropy || !probe.defined() || probe.dim() < 2) return;
  const int64_t classes = probe.size(-1);
  for (const auto& [which, d] : {std::pair<const char*, const data::Dataset*>{"training", &split.train},
                                 {"validation", &split.valid}}) {
    if (!d->y.defined() || d->y.is_floating_point() || d->y.numel() == 0) continue;
    const torch::Tensor kept = d->y.masked_select(d->y.ne(-100));  // cross_entropy's ignore_index
    // Every target ignored: each loss would be the mean of nothing, NaN from the first step.
    if (kept.numel() == 0)
      throw OptionError("data", Phrase(std::string("every ") + which + " target is -100, cross_entropy's ignore index: "
                                       "there is nothing to learn from or measure"));
    const int64_t lo = kept.min().item<int64_t>(), hi = kept.max().item<int64_t>();
    if (lo >= 0 && hi < classes) continue;
    throw OptionError("data", Phrase(std::string("the ") + which + " targets hold the class " + std::to_string(lo < 0 ? lo : hi) +
                                     ", but the model's output has " + std::to_string(classes) + " classes (0 to " +
                                     std::to_string(classes - 1) + "; -100 is ignored)"));
  }
}

namespace {
/// torch's name of a signed integer dtype ("int64"), or nullptr for any other.
const char* integer_dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    default: return nullptr;
  }
}
} // namespace

torch::Tensor check_model_fits_data(const Model& model, const LossFn& loss_fn, const data::Dataset& train,
                                    const std::string& which) {
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
    // Where it failed, when the error does not say (a TorchScript traceback names no module).
    const std::string place = failure_place(e, [&] { (void)model.forward(model.inputs_for(probe)); });  // "": the loss failed
    model.module().train();
    // A Python caller gets a ValueError: it is the data (or the model) that is wrong, not the run.
    const std::string cause = innermost_message(e);
    // A dtype mismatch has a usual cause, and a fix worth saying.
    std::string hint;
    if (cause.find("dtype") != std::string::npos || cause.find("scalar type") != std::string::npos) {
      for (const auto& x : probe.inputs()) {
        if (!hint.empty()) break;
        if (x.scalar_type() == torch::kByte)
          hint = "; the inputs are uint8: convert them to float (x.float() / 255 for images)";
        else if (const char* ints = integer_dtype_name(x.scalar_type()))  // int64 pixels, counts, ...
          hint = std::string("; the inputs are ") + ints +
                 " integers: if they are features rather than token ids, convert them to float (x.float(), / 255 for 0-255 pixels)";
      }
      for (const auto& p : model.module().parameters())
        if (hint.empty() && p.scalar_type() == torch::kDouble)
          hint = "; the model's parameters are float64: convert it with model.float()";
    }
    throw OptionError("data", Phrase("the model does not run on " + which +
                                     (place.empty() ? "" : " (" + place + ")") +
                                     ": " + cause + hint));
  }
  model.module().train();
  return pred;
}

std::unique_ptr<Learner> build_learner(const RunArgs& a, const data::DatasetSplit& split, bool progress) {
  const RunConfig& r = a.config;
  Model model = build_model(a);
  LossFn loss = r.loss == LossKind::kModel ? model_loss(model) : loss_for(r.loss);
  const torch::Tensor probe = check_model_fits_data(model, loss, split.train);
  check_class_targets(r, probe, split);
  check_model_fits_data(model, loss, split.valid, "the validation data");
  auto options = LearnerOptions().metrics(metrics_for(r, split, probe)).progress(progress).wd_bn_bias(r.wd_bn_bias);
  options.opt_func(a.loop ? loop_optimizer(*a.loop, model)  // the training loop's own optimizer
                          // torch.optim's update, through mixtrain's core; bf16-pure's rule from the
                          // start, so that its checkpoints load into the optimizer they were saved by
                          : optim::factory(r.opt, optim::Rounding()
                                                      .weight_update(r.precision_options.weight_update())
                                                      .seed(r.seed)));
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
  add_fit_warning(learn, config.precision);
}

void add_fit_warning(Learner& learn, Precision precision) {
  if (mode_of(precision).fit_warning) learn.add_cb(std::make_shared<diagnose::FitWarning>());
}

} // namespace mixtrain::run
