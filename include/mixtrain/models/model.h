#pragma once
/// Model: what a Learner trains. A type-erased module and its forward, the
/// structure of one forward's output (ModelOutput), and the loss of a model
/// that computes its own (model_loss).

#include "mixtrain/data/data.h"
#include "mixtrain/models/loss.h"
#include "mixtrain/models/module_scope.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mixtrain {

/// The arguments of a model's forward, in order.
using ModelInputs = std::vector<torch::Tensor>;

/// What one forward computed. Most models compute only the prediction; a model
/// that computes its own loss (a Hugging Face model given labels) also returns it.
struct ModelOutput {
  torch::Tensor prediction;  ///< what metrics, get_preds and predict see
  torch::Tensor loss;        ///< the model's own loss; undefined when it computed none
  std::string described;     ///< what forward returned, in words ("a dict with keys loss, logits"), for errors
};

/// A type-erased model: any torch::nn::Module holder whose forward takes one
/// Tensor and returns one (Sequential, Linear, a user-defined TORCH_MODULE), or
/// a module with a forward over several inputs (give the module and the call),
/// or a TorchScript file (mixtrain/scripted_model.h).
class Model {
 public:
  using Forward = std::function<torch::Tensor(const ModelInputs&)>;
  using OutputForward = std::function<ModelOutput(const ModelInputs&)>;
  Model() = default;
  /// A Sequential runs child by child, each in a ModuleScope of its index
  /// (mixtrain/module_scope.h), so that fp32 islands and the overflow tracer know
  /// which layer a parameter-free op (an activation, a residual add) belongs to.
  template <typename Holder, typename = decltype(std::declval<Holder&>()->forward(std::declval<torch::Tensor>()))>
  Model(Holder holder)  // NOLINT: implicit on purpose, so a Learner takes any holder
      : Model(holder.ptr(), forward_of(holder), 1) {}
  /// A module whose forward takes `num_inputs` tensors (-1: any number), run by `forward`.
  ///
  /// Example (a native module with two inputs):
  ///   mixtrain::Model model(net.ptr(), [net](const mixtrain::ModelInputs& in) mutable {
  ///     return net->forward(in[0], in[1]); }, 2);
  Model(std::shared_ptr<torch::nn::Module> module, Forward forward, int64_t num_inputs);
  /// A module that computes its own loss: when `takes_targets`, the batch's
  /// targets are passed as its last input (`num_inputs` counts them), and
  /// `forward` returns the loss beside the prediction; train it with model_loss().
  ///
  /// Example (a native module whose forward(x, y) returns {logits, loss}):
  ///   mixtrain::Model model(net.ptr(), [net](const mixtrain::ModelInputs& in) mutable {
  ///     auto [logits, loss] = net->forward(in[0], in[1]);
  ///     return mixtrain::ModelOutput{logits, loss, "logits and loss"}; }, 2, true);
  ///   mixtrain::Learner learn(model, dls, mixtrain::model_loss(model));
  Model(std::shared_ptr<torch::nn::Module> module, OutputForward forward, int64_t num_inputs, bool takes_targets);

  /// Runs forward on `inputs` and returns the prediction; throws c10::Error when
  /// their number is not what forward takes. What else it computed (the model's
  /// own loss) is last_output() until the next call.
  torch::Tensor forward(const ModelInputs& inputs) const;
  torch::Tensor forward(const torch::Tensor& x) const { return forward(ModelInputs{x}); }
  torch::Tensor operator()(const torch::Tensor& x) const { return forward(ModelInputs{x}); }
  torch::nn::Module& module() const { return *module_; }
  std::shared_ptr<torch::nn::Module> ptr() const { return module_; }
  /// How many inputs forward takes (-1: not known).
  int64_t num_inputs() const { return num_inputs_; }
  /// Whether forward takes the batch's targets as its last input (a model that computes its loss).
  bool takes_targets() const { return takes_targets_; }
  /// The arguments of forward for `batch`: its inputs, then its targets when the model takes them.
  ModelInputs inputs_for(const data::Batch& batch) const;
  /// The last forward's loss and description (its prediction is not kept).
  /// Shared by copies of this Model, as its module is.
  const ModelOutput& last_output() const { return *last_; }
  /// Parameters, then buffers: everything that makes two copies of the model
  /// compute the same. Detached, but sharing storage: writing to them (a
  /// broadcast, copy_) changes the model.
  std::vector<torch::Tensor> state_tensors() const;
  /// CRC-32 of state_tensors()' bytes: equal values mean (almost surely) identical
  /// weights, e.g. on every rank of a data-parallel run.
  uint32_t state_crc32() const;

 private:
  template <typename Holder>
  static Forward forward_of(Holder holder) {
    if constexpr (std::is_same_v<Holder, torch::nn::Sequential>) {
      return [holder](const ModelInputs& in) mutable -> torch::Tensor {
        torch::Tensor x = in.at(0);
        size_t i = 0;
        for (auto& layer : *holder) {
          const ModuleScope scope(std::to_string(i++));
          x = layer.forward(x);
        }
        return x;
      };
    } else {
      return [holder](const ModelInputs& in) mutable -> torch::Tensor { return holder->forward(in.at(0)); };
    }
  }

  std::shared_ptr<torch::nn::Module> module_;
  OutputForward forward_;
  int64_t num_inputs_ = -1;
  bool takes_targets_ = false;
  std::shared_ptr<ModelOutput> last_ = std::make_shared<ModelOutput>();
  friend LossFn model_loss(const Model& model);  // holds last_, so it outlives this Model
};

/// The loss the model computed itself in its last forward (ModelOutput::loss),
/// as fp32: for a model that takes the targets (Model::takes_targets). Throws
/// OptionError("loss") naming what the model returned when it computed no loss.
LossFn model_loss(const Model& model);

namespace detail {
/// model_loss's OptionError for a model that returned `described` and no loss.
[[noreturn]] void throw_no_model_loss(const std::string& described);
} // namespace detail

} // namespace mixtrain
