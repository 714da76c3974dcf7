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
/// Storage. While a fit runs, the trained weights, their gradients and the optimizer's
/// state are bf16 tensors, when two things hold: the Learner's optimizer is one of
/// mixtrain::optim's (the run layer's Learners: CLI, Python; a C++ Learner built with
/// opt_func(optim::factory(...))), which computes each update in fp32 from bf16 tensors
/// and writes it back once by the rule (counting what it lost), and the forward is real
/// bf16 (CUDA, or a CPU with bf16 units). Norm layers' parameters stay fp32 tensors
/// holding bf16 values: CPU kernels take a bf16 input only with fp32 norm parameters
/// (and BatchNorm's statistics are fp32). At the end of a fit the weights go back to
/// fp32 tensors (bf16 values), so what the caller exports or predicts with is the model
/// they gave, in its dtype; the optimizer's state stays bf16.
///
/// Otherwise (libtorch's own optimizers, which on bf16 tensors round at every op; the
/// emulated forward on a CPU without bf16 units, which reads fp32 tensors as bf16) the
/// bf16 values live in fp32 tensors, the optimizer computes in fp32, and this callback
/// rounds weight and state after its step. The numbers are the same both ways where
/// autocast casts every weight (Linear, Conv, norms: a test compares the two storages);
/// an op autocast does not cast (an Embedding's lookup) computes in bf16 on bf16
/// storage, as a model loaded in bf16 does. param_memory() is bf16's layout, which is
/// what the first way holds.
///
/// Example:
///   learn.set_precision(mixtrain::Precision::kBf16Pure,
///                       mixtrain::PrecisionOptions().weight_update(mixtrain::amp::WeightUpdate::kStochastic));

#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/amp/weight_update.h"

#include <cstdint>
#include <functional>
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
  std::optional<mixtrain::ParamMemory> param_memory() const override { return memory_; }
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
  void after_fit(Learner& learn) override;
  void on_error(Learner& learn) override;
  bool retry_forward_emulated(Learner& learn, const std::function<void()>& forward, const std::string& failure) override;

  /// Whether the last fit kept its trained weights in bf16 tensors (see Storage above).
  bool bf16_storage() const { return fit_on_bf16_; }

 private:
  /// One trained parameter: its tensor, its name, and what its updates lost.
  struct Param {
    std::string name;
    torch::Tensor weight;        // the Learner's parameter
    torch::Tensor before;        // fp32 storage: its values before this step
    torch::Tensor compensation;  // kahan, fp32 storage: what rounding dropped, carried to the next step
    LostUpdates total;
    bool in_norm_layer = false;  // a norm layer's own (an island's first candidate)
    bool bf16 = false;           // a bf16 tensor this fit (the optimizer rounds and counts it)
    int64_t opt_index = -1;      // its index in the optimizer's parameters
  };
  void prepare(Learner& learn);
  /// Moves the trained weights (and their gradients, state and compensations) to bf16
  /// tensors, or back to fp32 ones.
  void store_in_bf16(Learner& learn);
  void store_in_fp32(Learner& learn);
  /// Fills the report's islands (LostUpdateReport::islands) from the parameters' counts.
  void choose_islands(LostUpdateReport& report) const;

  WeightUpdate rule_;
  uint64_t seed_;
  std::vector<Param> params_;  // in the model's named_parameters() order, islands left out
  std::vector<torch::Tensor> frozen_;  // trained by nothing, stored in bf16 too
  int64_t state_tensors_ = 0;  // the optimizer's state tensors per parameter (an island's cost)
  const torch::nn::Module* prepared_for_module_ = nullptr;
  bool step_pending_ = false;
  std::vector<LostUpdates> per_epoch_;  // this run's epochs
  LostUpdates epoch_now_;
  bool resumed_ = false;  // load_state restored the counts: the next fit goes on with them
  std::optional<mixtrain::ParamMemory> memory_;
  bool bf16_storage_ = false;  // the trained weights are bf16 tensors now
  bool fit_on_bf16_ = false;   // the last fit's were
};

} // namespace mixtrain::amp
