#pragma once
/// PureBf16: bf16-pure training, the setup of Lightning's "bf16-true", a Hugging
/// Face model loaded in bfloat16 and trained by AdamW, or FSDP without fp32
/// shards: weights, gradients and optimizer state all bf16, no fp32 master copy.
///
/// The forward and backward compute as bf16 autocast does (MixedPrecision(kBFloat16):
/// real CPU autocast on a CPU with bf16 units, else the emulation). The update is
/// computed in fp32 from the bf16 weight, gradient and state by the Learner's own
/// optimizer, then rounded back once by the chosen rule (amp/weight_update.h), as
/// torchao's and optimi's low-precision optimizers do; the same pass counts the
/// updates rounding threw away. The optimizer's state is rounded to bf16 after
/// every step. fp32 islands (keep_fp32) keep their parameters and state in fp32.
///
/// Storage: the bf16 values live in fp32 tensors on every device. That is what lets
/// any libtorch optimizer compute its update in fp32 and have it rounded once
/// (on real bf16 tensors libtorch's optimizers compute in bf16, rounding at every
/// op). The numbers are bitwise those of bf16 storage with an fp32 update pass;
/// the memory the mode reports (param_memory) is bf16's layout, not these tensors'.
///
/// Example:
///   learn.set_precision(mixtrain::Precision::kBf16Pure,
///                       mixtrain::PrecisionOptions().weight_update(mixtrain::amp::WeightUpdate::kStochastic));

#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/amp/weight_update.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain::amp {

/// The callback (order 10). Learner::set_precision(Precision::kBf16Pure) attaches it.
class PureBf16 : public MixedPrecision {
 public:
  /// `seed` seeds stochastic rounding (with the step and the parameter's index),
  /// so the same seed gives bitwise the same run on every rank.
  explicit PureBf16(WeightUpdate rule = WeightUpdate::kNearest, uint64_t seed = 0);
  std::string name() const override { return "PureBf16"; }

  WeightUpdate rule() const { return rule_; }
  Precision precision() const override { return Precision::kBf16Pure; }
  bool pure_weights() const override { return true; }
  std::string mode_tag() const override;
  std::optional<ParamMemory> param_memory() const override { return memory_; }
  std::vector<torch::Tensor> state_tensors() const override;
  std::optional<LostUpdateReport> lost_updates() const override;
  void restart_lost_updates() override;

  /// Checkpoints carry the rule, the Kahan compensations and the counts.
  std::string state_key() const override { return "pure_bf16"; }
  void save_state(torch::serialize::OutputArchive& ar) const override;
  void load_state(torch::serialize::InputArchive& ar) override;

  void before_fit(Learner& learn) override;
  void before_batch(Learner& learn) override;
  void before_step(Learner& learn) override;
  void after_cancel_step(Learner& learn) override;
  void after_step(Learner& learn) override;
  void after_epoch(Learner& learn) override;

 private:
  /// One trained parameter: its tensor, its name, and what its updates lost.
  struct Param {
    std::string name;
    torch::Tensor weight;        // the Learner's parameter (fp32 storage of bf16 values)
    torch::Tensor before;        // its values before this step
    torch::Tensor compensation;  // kahan: what rounding dropped, carried to the next step
    LostUpdates total;
    bool in_norm_layer = false;  // a norm layer's own (an island's first candidate)
  };
  void prepare(Learner& learn);
  /// Fills the report's islands (LostUpdateReport::islands) from the parameters' counts.
  void choose_islands(LostUpdateReport& report) const;

  WeightUpdate rule_;
  uint64_t seed_;
  std::vector<Param> params_;  // in the model's named_parameters() order, islands left out
  int64_t state_tensors_ = 0;  // the optimizer's state tensors per parameter (an island's cost)
  const torch::nn::Module* prepared_for_module_ = nullptr;
  bool step_pending_ = false;
  std::vector<LostUpdates> per_epoch_;  // this run's epochs
  LostUpdates epoch_now_;
  bool resumed_ = false;  // load_state restored the counts: the next fit goes on with them
  std::optional<ParamMemory> memory_;
};

} // namespace mixtrain::amp
