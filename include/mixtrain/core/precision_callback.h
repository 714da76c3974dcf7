#pragma once
/// PrecisionCallback: what every mixed-precision callback (amp's MixedPrecision,
/// MasterWeights) tells the rest of the library. It is core's, because the
/// Learner calls it: checkpoints, data parallelism, the NaN stop, the doctor and
/// the front ends use this interface and never the concrete types.

#include "mixtrain/core/callback.h"
#include "mixtrain/core/precision.h"

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain {

namespace amp {
class GradScaler;
} // namespace amp

/// Bytes held for parameters, so a user can see what a mode costs.
struct ParamMemory {
  int64_t model = 0;            ///< the model's parameters (half / bf16, norms fp32)
  int64_t masters = 0;          ///< fp32 master copies
  int64_t grads = 0;            ///< model grads + master grads, once allocated
  int64_t optimizer_state = 0;  ///< the optimizer's state, where the mode stores it in 16 bits (bf16-pure)
  int64_t compensation = 0;     ///< Kahan compensations (bf16-pure with the kahan weight update)
};

/// What rounding did to the weight updates of a mode that stores 16-bit weights
/// without an fp32 copy (bf16-pure): how many element updates rounded to no change.
struct LostUpdateReport {
  std::string rule;                         ///< the weight update: "nearest", "stochastic", "kahan"
  /// The rule keeps what single steps do not apply (stochastic: in expectation, kahan: in
  /// its compensation), so a high `fraction` is no loss.
  bool keeps_dropped = false;
  int64_t intended = 0;                     ///< element updates that were nonzero in fp32
  int64_t lost = 0;                         ///< of which the weight rounded back to its old value
  double fraction = 0;                      ///< lost / intended
  double norm_ratio = 0;                    ///< |what rounding dropped| / |what was intended|
  std::vector<double> fraction_per_epoch;   ///< the same per epoch of the last fit
  struct Param {
    std::string name;
    int64_t numel = 0;
    double fraction = 0;          ///< its share of lost updates
    bool never_moved = false;     ///< every update it was meant to take was lost: it is still its initial value
    double mean_abs_weight = 0;   ///< typical |w|
    double rms_update = 0;        ///< typical |fp32 update| (lr x the optimizer's step)
  };
  std::vector<Param> worst;       ///< the parameters that lost most, worst first (up to 8)
  /// Every 16-bit trainable parameter's counts, in the model's order (a watch's evidence).
  struct Counts {
    std::string name;
    int64_t intended = 0, lost = 0;
  };
  std::vector<Counts> per_param;
  int64_t params = 0;             ///< elements of every 16-bit trainable parameter
  /// The modules worth keeping in fp32 (an island): a trainable parameter of their own lost
  /// at least kIslandLostShare of its updates (or never moved); norm layers first, then the smallest,
  /// while together they hold at most kIslandBudget of `params` (or kIslandBudgetElements).
  std::vector<std::string> islands;
  int64_t island_params = 0;      ///< their elements
  int64_t island_extra_bytes = 0; ///< what keeping them in fp32 adds (weight, gradient, optimizer state)
};
/// What LostUpdateReport's fraction and norm_ratio count under `rule` ("nearest",
/// "stochastic", "kahan"), in words: only under nearest rounding is an unchanged weight
/// an update lost; the others keep it (in expectation, or in the compensation).
std::string lost_updates_meaning(const std::string& rule);
/// A parameter that lost this share of its updates or more gains from an fp32 island.
constexpr double kIslandLostShare = 0.9;
/// Islands for lost updates hold at most this share of the parameters (norms are ~1%),
/// or kIslandBudgetElements, whichever is more.
constexpr double kIslandBudget = 0.05;
constexpr int64_t kIslandBudgetElements = 4096;

class PrecisionCallback : public Callback {
 public:
  /// The mode this callback is (Learner::precision() reads it): each mode says its own
  /// name rather than having it guessed back from the dtype and flags below.
  virtual Precision precision() const = 0;
  /// The dtype the model computes in: kHalf, kBFloat16, or kFloat (fp32 with a scaler).
  virtual c10::ScalarType dtype() const = 0;
  /// Whether the model is stored in dtype() with fp32 master weights (fastai v1's
  /// mode) rather than kept in fp32 under autocast.
  virtual bool master_weights() const { return false; }
  /// Whether the loss is multiplied by a loss scale before backward (and steps
  /// with inf/NaN gradients are skipped instead of applied).
  virtual bool loss_scaled() const = 0;
  /// The current loss scale (1 when the loss is not scaled). Its per-step history
  /// is the Recorder's (StepRecord::scale and ::skipped), kept in checkpoints.
  virtual double loss_scale() const = 0;
  /// Whether fp16 (or bf16) numerics are emulated on a device without them (fp16
  /// on a CPU, bf16 on a CPU without bf16 instructions),
  /// as decided at the start of the last fit.
  virtual bool emulated() const { return false; }
  /// The forward pass failed under the mode's real reduced-precision kernels
  /// (libtorch's CPU bf16 autocast meets an op it cannot run in bf16): runs `forward`
  /// again under the emulation instead. When that succeeds the mode stays emulated
  /// (emulated() is true) and says so once, naming `failure` (where and why the real
  /// path failed); returns whether it did. Modes without such a fallback, or whose
  /// retry fails too, return false with everything as it was.
  virtual bool retry_forward_emulated(Learner&, const std::function<void()>& forward, const std::string& failure) {
    (void)forward;
    (void)failure;
    return false;
  }
  /// Data parallelism: `reduce` turns a one-element float flag (1 = this rank saw
  /// inf/NaN gradients) into the maximum over all ranks, so every rank skips the
  /// same steps and keeps the same scale. nullptr removes it.
  virtual void set_found_inf_reducer(std::function<void(torch::Tensor& flag)> reduce) = 0;
  /// The GradScaler behind the loss scale, or nullptr (bf16, master weights): a
  /// callback that backpropagates an extra loss (a GAN's generator) scales it and
  /// steps its own optimizer with it.
  virtual amp::GradScaler* grad_scaler() { return nullptr; }
  /// A second loss that a callback backpropagates itself (a GAN's generator),
  /// scaled as the Learner's loss is (unchanged when the loss is not scaled).
  virtual torch::Tensor scale_extra_loss(const torch::Tensor& loss) { return loss; }
  /// Steps that callback's own optimizer after backward on scale_extra_loss's
  /// result: unscales its gradients and skips the step on inf/NaN when the loss
  /// is scaled, so both optimizers' checks feed one scale update. Returns
  /// whether the optimizer stepped.
  virtual bool step_extra_optimizer(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    return true;
  }
  /// The module paths or patterns the mode keeps in fp32 (fp32 islands), so the
  /// doctor's traced pass applies them as training does.
  virtual std::vector<std::string> keep_fp32() const { return {}; }
  /// A name of the mode stored in checkpoints ("mixed_precision:Half",
  /// "master_weights:BFloat16"), so that a checkpoint of one mode is refused by another.
  virtual std::string mode_tag() const = 0;
  /// Tensors beyond the model's parameters and buffers that make two replicas
  /// train the same (the fp32 masters); data parallelism broadcasts them.
  virtual std::vector<torch::Tensor> state_tensors() const { return {}; }
  /// Parameter memory by role when the mode keeps extra copies (master weights), else nullopt.
  virtual std::optional<ParamMemory> param_memory() const { return std::nullopt; }
  /// Whether weights, gradients and optimizer state are stored in dtype() itself,
  /// without an fp32 copy (bf16-pure).
  virtual bool pure_weights() const { return false; }
  /// Lost weight updates since the mode was attached (bf16-pure), or nullopt.
  virtual std::optional<LostUpdateReport> lost_updates() const { return std::nullopt; }
  /// Counts lost updates from nothing from here on: a window replayed from a checkpoint
  /// (mixtrain doctor --from) reports its own steps, not the run's before it.
  virtual void restart_lost_updates() {}
  /// Undoes what attaching did to the Learner before the callback is removed
  /// (master weights copy the fp32 masters back into an fp32 model).
  virtual void detach(Learner&) {}
};

} // namespace mixtrain
