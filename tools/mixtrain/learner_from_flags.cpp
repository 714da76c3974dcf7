#include "learner_from_flags.h"

#include <algorithm>
#include <filesystem>
#include <string>

namespace mixtrain_cli {

namespace {

bool is_language_model(const mixtrain::RunConfig& r) { return r.model == "transformer"; }

/// The data the flags name: the transformer's text, a tensor file, or Fashion-MNIST.
mixtrain::data::DatasetSplit read_data(const mixtrain::RunConfig& r) {
  namespace fs = std::filesystem;
  if (is_language_model(r)) return mixtrain::data::text_corpus(r.data.empty() ? mixtrain::data::kFortunesDir : r.data);
  if (!r.data.empty() && fs::is_regular_file(r.data)) return mixtrain::data::load_tensor_file(r.data, r.seed);
  if (!r.data.empty() && !fs::is_directory(r.data))
    throw UsageError("--data " + r.data + " is neither a directory (Fashion-MNIST) nor a file (torch.save)");
  return mixtrain::data::fashion_mnist(r.data.empty() ? mixtrain::data::kFashionMnistDir : r.data);
}

std::vector<mixtrain::Metric> metrics_for(const mixtrain::RunConfig& r) {
  if (is_language_model(r)) return {mixtrain::accuracy(), mixtrain::perplexity()};
  if (r.loss == "cross_entropy") return {mixtrain::accuracy()};
  if (r.loss == "bce_with_logits") return {mixtrain::binary_accuracy()};
  return {};  // mse: the validation loss says it
}

/// One forward and loss on two samples, so that a model that does not fit the
/// data (input count, output shape, target dtype) is a one-line error before
/// anything trains or is written.
void check_model_fits_data(mixtrain::Learner& learn) {
  const mixtrain::data::Batch probe = mixtrain::data::Batch::head_of(learn.dls().train.dataset(), 2);
  torch::NoGradGuard no_grad;
  learn.model().module().eval();
  try {
    torch::Tensor pred = learn.model().forward(probe.inputs());
    if (pred.is_floating_point()) pred = pred.to(torch::kFloat);
    learn.loss_fn()(pred, probe.y);
  } catch (const std::exception& e) {
    learn.model().module().train();
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::string m = c10_error ? c10_error->what_without_backtrace() : e.what();
    // A scripted model's errors come after its TorchScript traceback: keep the line that says what failed.
    const size_t cause = m.rfind("RuntimeError: ");
    if (cause != std::string::npos) m = m.substr(cause + 14);
    throw UsageError("the model does not run on the data: " + m.substr(0, m.find('\n')));
  }
  learn.model().module().train();
}

/// --split-at's groups (the splitter runs here, so a bad name is a usage error
/// before training), --lr's count against them, and --freeze-to.
void apply_param_groups(const mixtrain::RunConfig& r, mixtrain::Learner& learn) {
  int64_t groups = 1;
  try {
    groups = learn.n_groups();
  } catch (const c10::Error& e) {
    std::string m = e.msg();
    if (m.rfind("split_at: ", 0) == 0) m = m.substr(10);
    throw UsageError("--split-at " + r.split_at + ": " + m.substr(0, m.find('\n')));
  }
  try {
    r.lr.for_groups(groups);
  } catch (const c10::Error& e) {
    throw UsageError("--lr " + r.lr.str() + ": " + e.msg() + (r.split_at.empty() ? " (--split-at makes groups)" : ""));
  }
  if (r.freeze_to == 0) return;
  if (r.freeze_to < 0 || r.freeze_to >= groups)
    throw UsageError("invalid --freeze-to " + std::to_string(r.freeze_to) + ": --split-at " + r.split_at + " makes " +
                     std::to_string(groups) + " parameter groups, so it must be in [0, " + std::to_string(groups - 1) +
                     "] (the last group always trains)");
  learn.freeze_to(r.freeze_to);
}

} // namespace

mixtrain::data::DatasetSplit load_split(const mixtrain::RunConfig& r, int world_size) {
  auto split = read_data(r);
  if (r.limit > 0) split.train = split.train.head(r.limit);
  // Under data parallelism every rank gets its shard of the training set.
  const int64_t per_rank = split.train.size() / std::max(1, world_size);
  const std::string each = world_size > 1 ? ", " + std::to_string(per_rank) + " per rank of " +
                                                std::to_string(world_size) : "";
  if (per_rank < r.bs)
    throw UsageError("the training set (" + std::to_string(split.train.size()) + " samples" + each +
                     ") is smaller than --bs " + std::to_string(r.bs) + ": no full batch to train on");
  if (r.accum > per_rank / r.bs)
    throw UsageError("--accum " + std::to_string(r.accum) + " is more than the " + std::to_string(per_rank / r.bs) +
                     " batches of an epoch" + (each.empty() ? "" : " (" + each.substr(2) + ")") +
                     ": no optimizer step would run");
  if (split.valid.size() == 0) throw UsageError("the validation set is empty");
  return split;
}

mixtrain::ThreadPolicy thread_policy(const mixtrain::RunConfig& r) {
  return is_language_model(r) ? mixtrain::ThreadPolicy::kBlas : mixtrain::ThreadPolicy::kIntraOp;
}

mixtrain::Model build_model(const mixtrain::RunConfig& r) {
  return is_builtin_model(r.model) ? mixtrain::models::by_name(r.model) : mixtrain::load_scripted_model(r.model);
}

std::unique_ptr<mixtrain::Learner> build_learner(const mixtrain::RunConfig& r, const mixtrain::data::DatasetSplit& split,
                                                 bool progress) {
  auto options = mixtrain::LearnerOptions().metrics(metrics_for(r)).progress(progress).wd_bn_bias(r.wd_bn_bias);
  if (!r.split_at.empty()) {
    try {
      options.splitter(mixtrain::split_at(mixtrain::split_names(r.split_at)));
    } catch (const c10::Error& e) {
      throw UsageError("--split-at " + r.split_at + ": " + e.msg());
    }
  }
  auto learn = std::make_unique<mixtrain::Learner>(
      build_model(r), mixtrain::data::DataLoaders::from_split(split, r.bs, r.seed), mixtrain::loss_by_name(r.loss),
      options);
  check_model_fits_data(*learn);
  apply_param_groups(r, *learn);
  // Orders 20 and 5: they run after / before the precision callbacks added later, whatever the insertion order.
  if (r.clip > 0) learn->add_cb(std::make_shared<mixtrain::callbacks::GradientClip>(r.clip));
  if (r.accum > 1) learn->add_cb(std::make_shared<mixtrain::callbacks::GradientAccumulation>(r.accum));
  return learn;
}

} // namespace mixtrain_cli
