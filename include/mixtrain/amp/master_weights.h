#pragma once
/// fastai v1-style mixed precision: the model's weights stored in half (or
/// bf16), an fp32 master copy that the optimizer updates, norm layers in fp32,
/// and steps that are truly skipped on overflow.

#include "mixtrain/amp/loss_scale_rule.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/models/norm_layer.h"

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

namespace torch::nn { class Module; }

namespace mixtrain::amp {

/// MasterWeights' options, with fastai v1's defaults.
struct MasterWeightsOptions {
  /// Storage dtype of the model: kHalf or kBFloat16.
  TORCH_ARG(c10::ScalarType, dtype) = c10::ScalarType::Half;
  /// Initial loss scale; 0 means fastai's default: 2^16 when dynamic, 512 when static.
  TORCH_ARG(double, loss_scale) = 0;
  /// Dynamic scaling: halve on overflow, double after max_noskip clean steps.
  TORCH_ARG(bool, dynamic) = true;
  /// Clean steps before the scale doubles.
  TORCH_ARG(int64_t, max_noskip) = 1000;
  /// The scale never grows past this (2^24).
  TORCH_ARG(double, max_scale) = 16777216.0;
  /// Clip the fp32 master gradients to this global norm (0: no clipping).
  TORCH_ARG(double, clip) = 0;
  /// Keep each param group's masters in one contiguous fp32 buffer: the
  /// optimizer then steps one tensor per group, and the model-to-master grad
  /// copy is one kernel. A parameter without a gradient at a step keeps its
  /// weights (its master is put back after the step); the optimizer's state for
  /// its slice (Adam's moments, SGD's momentum) still decays, as it does not with
  /// per-parameter masters.
  TORCH_ARG(bool, flat_master) = false;
  /// Cast predictions to fp32 before the loss.
  TORCH_ARG(bool, loss_fp32) = true;
  /// fp32 islands (mixtrain/amp/fp32_islands.h): these modules' parameters stay
  /// fp32, as norm layers' do, and their ops compute in fp32.
  TORCH_ARG(std::vector<std::string>, keep_fp32);
};

/// Throws c10::Error naming the first invalid option.
void validate(const MasterWeightsOptions& options);


/// Master-weights mode keeps normalization layers (mixtrain::is_norm_layer) in fp32.
using mixtrain::is_norm_layer;

/// The callback (order 10). Learner::to_half attaches it; construction converts
/// the model, creates the masters and rebuilds the optimizer over them (keeping
/// each param group's options). Each training step:
///   before_backward: loss * scale;
///   before_step: one fused inf/NaN check over the model's grads. On overflow the
///     step is cancelled (weights, masters and optimizer state untouched, no
///     weight decay, no momentum), the grads are dropped, the clean counter
///     resets and, when dynamic and scale > 1, the scale halves. Otherwise the
///     grads go to the masters, are divided by the scale and clipped; the
///     Learner steps the optimizer;
///   after_step: the masters are copied back into the model; after max_noskip
///     clean steps the scale doubles, up to max_scale.
/// The scale follows LossScaleRule (growth 2, back-off 0.5, growth_interval
/// max_noskip, max_scale, never below 1), the rule GradScaler uses.
/// Inputs are cast to the model's dtype; norm layers get fp32 inputs and give
/// back the model's dtype.
class MasterWeights : public PrecisionCallback {
 public:
  /// Converts learn's model and builds the masters and the optimizer over them.
  MasterWeights(Learner& learn, MasterWeightsOptions options);
  ~MasterWeights() override;
  std::string name() const override { return "MasterWeights"; }

  const MasterWeightsOptions& options() const { return options_; }
  /// kFp16Master or kBf16Master, by the options' dtype.
  Precision precision() const override;
  c10::ScalarType dtype() const override { return options_.dtype(); }
  bool master_weights() const override { return true; }
  std::vector<std::string> keep_fp32() const override { return options_.keep_fp32(); }
  bool loss_scaled() const override { return true; }
  double loss_scale() const override { return rule_.scale(); }
  void set_found_inf_reducer(std::function<void(torch::Tensor& flag)> reduce) override {
    reduce_overflow_ = std::move(reduce);
  }
  std::string mode_tag() const override;
  /// Clean steps since the last skip or doubling.
  int64_t clean_steps() const { return rule_.growth_tracker(); }
  /// The fp32 masters the optimizer updates (one flat tensor per group with flat_master).
  const std::vector<torch::Tensor>& masters() const { return masters_; }
  std::vector<torch::Tensor> state_tensors() const override;
  ParamMemory memory() const;
  std::optional<ParamMemory> param_memory() const override { return memory(); }
  /// Copies the masters into the model as fp32, converts the model back to fp32
  /// and rebuilds the optimizer over the model (Learner::to_fp32 calls this).
  void detach(Learner& learn) override;

  /// Checkpoints carry the fp32 masters (so save/load loses no precision), the
  /// scale and the clean-step counter.
  std::string state_key() const override { return "master_weights"; }
  void save_state(torch::serialize::OutputArchive& ar) const override;
  void load_state(torch::serialize::InputArchive& ar) override;

  void before_fit(Learner& learn) override;
  void before_batch(Learner& learn) override;
  void after_pred(Learner& learn) override;
  void after_loss(Learner& learn) override;
  void before_backward(Learner& learn) override;
  void before_step(Learner& learn) override;
  void after_step(Learner& learn) override;
  void after_batch(Learner& learn) override;
  void after_cancel_batch(Learner& learn) override;
  void after_fit(Learner& learn) override;
  void on_error(Learner& learn) override;

 private:
  std::function<void(torch::Tensor&)> reduce_overflow_;
  struct Group {
    std::vector<torch::Tensor> params;  // the model's parameters in this optimizer group
    std::vector<torch::Tensor> masters; // per-parameter masters, or views into `flat`
    torch::Tensor flat;                 // flat_master only: the group's master buffer
  };
  void rebuild_optimizer(Learner& learn);
  void copy_masters_to_model();

  MasterWeightsOptions options_;
  LossScaleRule rule_;
  bool stepped_ = false;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> untouched_;  // flat_master: (master view, its value) to put back
  std::vector<Group> groups_;
  std::vector<torch::Tensor> masters_;  // what the optimizer holds
  std::vector<torch::Tensor> model_params_;
  const void* optimizer_ = nullptr;     // the optimizer already rebuilt over masters_
  void end_forward_region();
  std::shared_ptr<void> norm_mode_;     // fp32 norm layers: on during the forward region only
  std::shared_ptr<void> islands_;       // fp32 islands: on during the forward region only
  std::shared_ptr<const std::unordered_set<const void*>> island_params_;  // their parameters, worked out once
};

} // namespace mixtrain::amp
