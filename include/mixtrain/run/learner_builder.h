#pragma once
/// Building a Learner from a run configuration: the model (by name from the
/// registry, or a TorchScript file), the data, the loss, the metrics the data
/// calls for, parameter groups, clipping and accumulation; and the probe that
/// says, before anything trains, whether the model runs on the data at all.

#include "mixtrain/data/data.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/run/options.h"
#include "mixtrain/run/run_config.h"
#include "mixtrain/util/threads.h"

#include <memory>

namespace mixtrain::run {

/// Loads the data the configuration names (or the model's own, or the args'
/// data_source), applies its limit, and checks that each of `world_size` ranks
/// gets a full batch and an optimizer step. Throws OptionError (data, bs, accum)
/// or c10::Error naming the problem.
data::DatasetSplit load_split(const RunArgs& args, int world_size);

/// Where the threads go: the configuration's thread_policy, or the model's own
/// (the registry's; intra_op for a TorchScript model) when it is "auto".
ThreadPolicy thread_policy(const RunConfig& config);

/// What a command has once its flags are checked: the threads it runs on and its data.
struct RunStart {
  int threads = 0;  ///< the intra-op threads set (configure_threads)
  /// Why `--threads 0` ("all cores") chose fewer than the CPUs online: CpuBudget::why(); "" otherwise.
  std::string threads_why;
  data::DatasetSplit split;
};
/// "2 thread(s)", or "1 thread(s) (this process may run on 1 of 2 CPUs)": a command's header words.
std::string threads_words(const RunStart& start);
/// The start train, lr_find and the doctors share, in this order: the thread count set
/// by the model's policy, the seed drawn, the data read and checked (load_split). Called
/// after the command's own checks and before its folder is created, so that bad data is
/// refused before anything is written.
RunStart start_run(const RunArgs& args, int world_size);

/// The model the configuration names: a built-in one, or a TorchScript file.
Model build_model(const RunConfig& config);
/// The args' model_source when they have one, else the configuration's model.
Model build_model(const RunArgs& args);

/// Whether the data is a sequence of classes (integer targets [N, T]): a
/// language model, built-in or TorchScript. Such runs report perplexity.
bool is_sequence_classification(const data::DatasetSplit& split, const RunConfig& config);

/// The metrics the loss and data call for: accuracy for classes (and perplexity
/// for sequences), binary accuracy for bce_with_logits, none for mse; for a
/// model's own loss, accuracy when `prediction` (a probe's) is class scores [N, C]
/// for class targets [N], else none.
std::vector<Metric> metrics_for(const RunConfig& config, const data::DatasetSplit& split,
                                const torch::Tensor& prediction = {});

/// The Learner `train`, `doctor` and `lr_find` share, in fp32 (the caller sets
/// the precision): model, data, loss and metrics, parameter groups and freezing,
/// clipping and accumulation. Throws OptionError for a bad split_at, lr count or
/// freeze_to, and OptionError("data") when the model does not run on the data
/// (one line saying why, checked on two samples before anything trains).
std::unique_ptr<Learner> build_learner(const RunArgs& args, const data::DatasetSplit& split, bool progress);

/// Sets the configuration's precision mode on `learn` (stochastic rounding seeded
/// by the run's seed) and, where a run can end with skipped steps (fp16) or lost
/// weight updates (bf16-pure), attaches the end-of-fit warning
/// (diagnose::FitWarning): train and lr_find want it, the doctor's runs do not.
void set_precision(Learner& learn, const RunConfig& config);
/// The end-of-fit warning (diagnose::FitWarning) for a mode that has one (fp16, bf16-pure):
/// set_precision attaches it; a Learner whose mode came from a checkpoint gets it here.
void add_fit_warning(Learner& learn, Precision precision);

/// One forward and loss on the first two samples of `train` in eval mode, before
/// anything is built on the model; returns the prediction (fp32). Throws
/// OptionError("data") with one line saying why a model that does not fit the data (input
/// count, output shape, target dtype) fails, and the OptionError of an output or
/// loss choice that does not fit what the model returns.
/// `which` names the data in that line ("the data", "the validation data").
torch::Tensor check_model_fits_data(const Model& model, const LossFn& loss_fn, const data::Dataset& train,
                                    const std::string& which = "the data");

/// With cross_entropy: every class target of both splits is a class of the
/// prediction `probe` (0 to C-1; -100, cross_entropy's ignore_index, is allowed).
/// Throws OptionError("data") naming the split and the class, before anything
/// trains (libtorch's own "Target 10 is out of bounds" comes mid-epoch).
void check_class_targets(const RunConfig& r, const torch::Tensor& probe, const data::DatasetSplit& split);

} // namespace mixtrain::run
