#pragma once
/// Learner: a model, its data, a loss and an optimizer, trained by a loop that
/// fires fastai's events. Everything beyond the bare loop (recording, progress,
/// schedules, mixed precision) is a callback.

#include "mixtrain/core/callback.h"
#include "mixtrain/data/data.h"
#include "mixtrain/core/metrics.h"
#include "mixtrain/core/optimizers.h"
#include "mixtrain/models/loss.h"
#include "mixtrain/models/model.h"
#include "mixtrain/core/param_groups.h"
#include "mixtrain/core/recorder.h"
#include "mixtrain/core/schedule.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <limits>
#include <optional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mixtrain {

// The precision one-liners below take amp's options; the loop itself knows
// nothing about mixed precision (amp/precision_options.h defines them).
namespace amp {
struct GradScalerOptions;
struct MasterWeightsOptions;
} // namespace amp
class PrecisionCallback;
enum class Precision;
struct PrecisionOptions;
struct LrFindOptions;
struct LrFindResult;

/// Annotations of the current training step, filled by callbacks (mixed
/// precision, clipping) and copied by the Recorder into its step row.
struct StepInfo {
  double scale = std::numeric_limits<double>::quiet_NaN();      ///< loss scale used
  bool skipped = false;                                          ///< optimizer step skipped
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  ///< unscaled global grad norm
};

/// fastai's default optimizer: AdamW with betas (0.9, 0.99), eps 1e-5, decoupled weight decay 0.01.
OptimizerFactory adamw(double beta1 = 0.9, double beta2 = 0.99, double eps = 1e-5, double weight_decay = 0.01);
/// SGD with momentum and (coupled) weight decay.
OptimizerFactory sgd(double momentum = 0.9, double weight_decay = 0.0);
struct LearnerOptions {
  /// Optimizer factory (default: fastai's AdamW).
  TORCH_ARG(OptimizerFactory, opt_func) = adamw();
  /// Metrics computed on the validation set every epoch.
  TORCH_ARG(std::vector<Metric>, metrics);
  /// Attach the progress printer (live bar on a TTY, one line per epoch otherwise).
  TORCH_ARG(bool, progress) = true;
  /// Device for the model and batches.
  TORCH_ARG(torch::Device, device) = torch::Device(torch::kCPU);
  /// Decay norm layers' parameters and biases too (fastai's wd_bn_bias, default
  /// false: they get weight decay 0 in a param group of their own, for the
  /// optimizers libtorch ships: AdamW, Adam, SGD, RMSprop, Adagrad).
  TORCH_ARG(bool, wd_bn_bias) = false;
  /// Cuts the model's parameters into groups (mixtrain/param_groups.h): one
  /// learning rate per group, and freeze_to. Default: one group of every parameter.
  /// It runs once, in the Learner's constructor (a name that matches no layer
  /// throws there), so asking for the groups later builds nothing.
  TORCH_ARG(Splitter, splitter) = nullptr;
  /// Norm layers stay trainable in frozen groups (fastai's train_bn).
  TORCH_ARG(bool, train_bn) = true;
};

/// fastai's default learning rate for fit / fit_one_cycle.
constexpr double kDefaultLr = 1e-3;

/// Trains a model with callbacks, as fastai's Learner.
///
/// Example:
///   auto split = mixtrain::data::fashion_mnist();
///   mixtrain::Learner learn(mixtrain::models::simple_cnn(),
///                           mixtrain::data::DataLoaders::from_split(split, 256, 42),
///                           mixtrain::cross_entropy(),
///                           mixtrain::LearnerOptions().metrics({mixtrain::accuracy()}));
///   learn.fit_one_cycle(1, 3e-3);
///   double acc = learn.recorder().values().back().metrics[0];
class Learner {
 public:
  Learner(Model model, data::DataLoaders dls, LossFn loss_fn, LearnerOptions options = {});

  /// Trains `n_epoch` epochs at constant `lr` (one value, or one per parameter
  /// group: Lrs, lr_slice). `cbs` are attached for this fit only.
  void fit(int64_t n_epoch, Lrs lr = kDefaultLr, std::vector<CallbackPtr> cbs = {});
  /// Trains with the one-cycle policy (lr and momentum schedules), fastai's
  /// defaults; each parameter group follows the cycle to its own peak in `lr_max`.
  void fit_one_cycle(int64_t n_epoch, Lrs lr_max = kDefaultLr, OneCycleOptions options = {},
                     std::vector<CallbackPtr> cbs = {});
  /// fastai's fine_tune: `freeze_epochs` one-cycle epochs with only the last
  /// group training (at slice(base_lr)), then `epochs` with every group, at
  /// slice(base_lr / 2 / lr_mult, base_lr / 2), pct_start 0.3 and div 5.
  void fine_tune(int64_t epochs, double base_lr = 2e-3, int64_t freeze_epochs = 1, double lr_mult = 100);

  // ---- Parameter groups (fastai's splitter, freeze, discriminative lr) --------
  /// How many groups the splitter made (1 without one). The splitter runs once,
  /// in the constructor: asking builds nothing.
  int64_t n_groups() const { return static_cast<int64_t>(groups_.size()); }
  /// Trains only groups n.. from now on: the parameters of groups before n stop
  /// requiring gradients (norm layers' stay trainable with train_bn), so the
  /// optimizer leaves them and their state untouched. Negative n counts from the
  /// end. Throws c10::Error unless -n_groups < n < n_groups (at least one group trains).
  void freeze_to(int64_t n);
  /// Trains only the last group (fastai's freeze).
  void freeze() { freeze_to(-1); }
  /// Trains every group.
  void unfreeze() { freeze_to(0); }
  /// Groups before this one are frozen (0: none).
  int64_t frozen_idx() const { return frozen_idx_; }
  /// The model's parameters of each group, as the splitter made them.
  const ParamGroups& param_groups() const { return groups_; }
  /// Sets each group's learning rate (one value per group; every optimizer
  /// param group of a parameter group gets it). Throws c10::Error on a count mismatch.
  void set_lrs(const std::vector<double>& lrs);
  /// Each parameter group's current learning rate.
  std::vector<double> group_lrs();
  /// Runs the validation set: returns {valid_loss, metric...}.
  std::vector<double> validate();
  /// Predictions and targets over the validation set, concatenated.
  std::pair<torch::Tensor, torch::Tensor> get_preds();
  /// The same over any loader (new data, the training set), with the model in
  /// eval mode and the precision mode's forward (fp16 emulation on CPU), as validation.
  std::pair<torch::Tensor, torch::Tensor> get_preds(const data::DataLoader& loader);

  /// fastai's lr_find (mixtrain/lr_find.h): sweeps the learning rate exponentially
  /// over `num_it` training steps, stops when the loss diverges, and returns the
  /// curve and fastai's suggestions. The model, the optimizer, every callback's
  /// state and the random generators are restored afterwards: the next fit runs
  /// exactly as if lr_find never ran. Throws c10::Error naming a bad option.
  ///
  /// Example:
  ///   mixtrain::LrFindResult r = learn.lr_find();
  ///   learn.fit_one_cycle(1, r.valley);
  LrFindResult lr_find();
  LrFindResult lr_find(const LrFindOptions& options);

  /// Trains in `precision` from now on (fp32, fp16, bf16, fp16-master,
  /// bf16-master; see mixtrain/core/precision.h), replacing any earlier precision mode.
  /// Throws c10::Error naming a bad option. Chainable.
  ///
  /// Example:
  ///   learn.set_precision(mixtrain::Precision::kFp16,
  ///                       mixtrain::PrecisionOptions().scaler(mixtrain::amp::GradScalerOptions().init_scale(256)));
  Learner& set_precision(Precision precision, const PrecisionOptions& options);
  Learner& set_precision(Precision precision);
  /// The precision mode the Learner trains in.
  Precision precision() const;
  /// The attached precision callback (scale, dtype, emulation), or nullptr in fp32.
  std::shared_ptr<PrecisionCallback> precision_cb() const;

  /// fastai's to_fp16: fp16 autocast and dynamic loss scaling. On CPU fp16
  /// numerics are emulated, unless `allow_fp16_emulation` is false (then fit throws).
  Learner& to_fp16();
  Learner& to_fp16(const amp::GradScalerOptions& scaler_options, bool allow_fp16_emulation = true);
  /// fastai's to_bf16: bf16 autocast, no loss scaling.
  Learner& to_bf16();
  /// fastai v1's mixed precision: the model stored in `options.dtype()` (fp16 by
  /// default; norm layers fp32), fp32 master weights updated by the optimizer,
  /// dynamic loss scaling with true skips.
  Learner& to_half();
  Learner& to_half(const amp::MasterWeightsOptions& options);
  /// Back to full precision: detaches the precision callback (master weights are
  /// copied back into an fp32 model). The Recorder keeps the scale/skip history.
  Learner& to_fp32();

  /// Writes everything an exact resume needs to `path`: model, optimizer state,
  /// every stateful callback (Recorder history, GradScaler, fp32 masters, scale
  /// history), epoch / batch / iteration (hence the schedule position), and the
  /// RNG states (torch's global generator and the training loader's). Call it
  /// between batches, e.g. from after_batch or after_epoch. The write is atomic:
  /// a temporary file in the same directory, fsync, rename; a crash mid-save
  /// leaves the previous file intact. Missing folders on the path are created.
  void save(const std::string& path);
  /// The same checkpoint's bytes, in memory (load_from_memory reads them back).
  std::string save_to_memory();
  /// Restores a checkpoint written by save(). The next fit, called with the same
  /// number of epochs, continues exactly where the saved one stopped. Throws
  /// c10::Error naming the problem for a missing, truncated or corrupt file, or
  /// one from another model or precision mode; the Learner is unchanged then.
  void load(const std::string& path);
  /// The same from a checkpoint's bytes in memory; `name` stands for the file in messages.
  void load_from_memory(const char* data, size_t size, const std::string& name = "<memory>");
  /// Opens the libtorch archive inside a checkpoint file (after checking its
  /// header, size and checksum), to read entries such as "model.param.<name>"
  /// directly. Throws c10::Error naming the problem.
  static void open_checkpoint(const std::string& path, torch::serialize::InputArchive& archive);
  /// The same over a checkpoint's bytes in memory (read once, opened as often as needed).
  static void open_checkpoint(const char* data, size_t size, const std::string& name, torch::serialize::InputArchive& archive);
  /// True while a fit continues from a loaded checkpoint (until the training
  /// phase of the epoch it resumed in ends).
  bool resuming() const { return resume_.active.has_value(); }

  /// Attaches a callback (kept sorted by `order`, stable). Returns *this for chaining.
  Learner& add_cb(CallbackPtr cb);
  /// Detaches a callback; no-op when it is not attached.
  Learner& remove_cb(const CallbackPtr& cb);
  /// The attached callbacks, in run order.
  const std::vector<CallbackPtr>& cbs() const { return cbs_; }
  /// The first attached callback of type T, or nullptr.
  template <typename T>
  std::shared_ptr<T> get_cb() const {
    for (const auto& cb : cbs_)
      if (auto t = std::dynamic_pointer_cast<T>(cb)) return t;
    return nullptr;
  }

  // ---- What callbacks may read and change ----------------------------------
  Model& model() { return model_; }
  data::DataLoaders& dls() { return dls_; }
  const LossFn& loss_fn() const { return loss_fn_; }
  /// The optimizer, created from opt_func on first use (as fastai's create_opt).
  torch::optim::Optimizer& opt();
  bool has_opt() const { return static_cast<bool>(opt_); }
  /// Replaces the optimizer (e.g. rebuilt over fp32 master weights). It must keep
  /// the old one's param groups, in order: they say which parameter group is which.
  void set_opt(std::unique_ptr<torch::optim::Optimizer> opt) { opt_ = std::move(opt); }
  Recorder& recorder() { return *recorder_; }
  const LearnerOptions& options() const { return options_; }
  torch::Device device() const { return options_.device(); }

  /// Current batch (inputs and targets); replaceable in before_batch.
  data::Batch& batch() { return batch_; }
  /// Model output of the current batch; replaceable in after_pred.
  torch::Tensor& pred() { return pred_; }
  /// Detached loss of the current batch (what is logged); replaceable in after_loss.
  torch::Tensor& loss() { return loss_; }
  /// The current batch's loss as a number, read from the device once per batch
  /// and shared by every callback (the Recorder, the NaN stop, the progress
  /// output). A callback that reads other values from the device in the step
  /// (the loss scaler's found_inf) reads the loss with them (mixtrain/host_read.h)
  /// and hands it over with provide_loss_value: one transfer per step.
  double loss_value();
  void provide_loss_value(double value);
  /// Annotations of the current step (scale, skipped, grad norm); reset every batch.
  StepInfo& step_info() { return step_info_; }
  /// The loss backward runs on (fastai's loss_grad); scaled by mixed precision.
  torch::Tensor& loss_grad() { return loss_grad_; }

  bool training() const { return training_; }
  int64_t epoch() const { return epoch_; }
  int64_t n_epoch() const { return n_epoch_; }
  /// Batch index within the current train or validation pass.
  int64_t iter() const { return iter_; }
  /// Batches in the current pass.
  int64_t n_iter() const { return n_iter_; }
  /// Training batches done in this fit; in after_batch it counts the current one.
  int64_t train_iter() const { return train_iter_; }
  /// Training progress in [0, 1): train_iter / (n_epoch * batches per epoch).
  double pct_train() const;

 private:
  void run(Event event);
  /// Runs `body`; on an exception that escapes it, calls every callback's on_error, then rethrows.
  template <typename F>
  void releasing_on_error(F&& body);
  template <typename Cancel, typename F>
  void with_events(F&& body, Event before, Event after_cancel, Event after);
  void do_fit();
  /// What a checkpoint holds (save() streams it into a file, save_to_memory() into bytes).
  void write_checkpoint_archive(torch::serialize::OutputArchive& ar);
  void do_epoch();
  void all_batches(data::DataLoader& dl);
  void one_batch(int64_t i, const data::Batch& b);
  void do_one_batch();
  void do_validate_epoch();

  Model model_;
  data::DataLoaders dls_;
  LossFn loss_fn_;
  LearnerOptions options_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  ParamGroups groups_;                  // the model's parameters per group (the splitter's)
  std::vector<int64_t> group_of_opt_group_;  // parameter group of each optimizer param group
  int64_t frozen_idx_ = 0;
  std::shared_ptr<Recorder> recorder_;
  std::vector<CallbackPtr> cbs_;

  /// A point in training: the epoch, its next training batch, and the training
  /// loader's generator as that epoch began (to replay its permutation).
  struct Position {
    int64_t epoch = 0, batch = 0;
    torch::Tensor loader_state;
  };
  /// All resume state, in one place.
  struct ResumeState {
    Position now;  ///< where training would continue now: what save() writes
    struct Pending {
      Position at;
      int64_t train_iter = 0, n_epoch = 0;
    };
    std::optional<Pending> pending;  ///< set by load(), taken by the next fit
    std::optional<Position> active;  ///< the point the running fit resumed from, until that epoch's training ends
  };
  ResumeState resume_;
  /// Runs the splitter and checks its groups (the constructor's; groups_ never changes after).
  ParamGroups make_groups();

  data::Batch batch_;
  torch::Tensor pred_, loss_, loss_grad_;
  double loss_value_ = std::numeric_limits<double>::quiet_NaN();
  // The loss_ it was read from (a callback may replace loss_), held: a freed loss's address
  // could be a new loss's, and an address alone would then read back the old value.
  torch::Tensor loss_value_of_;
  StepInfo step_info_;
  bool training_ = false;
  int64_t epoch_ = 0, n_epoch_ = 0, iter_ = 0, n_iter_ = 0, train_iter_ = 0;
};

} // namespace mixtrain
