#include "mixtrain/models/model.h"

#include "mixtrain/util/option_error.h"

#include <torch/nn/functional/loss.h>

#include <zlib.h>

#include <sstream>

namespace mixtrain {

Model::Model(std::shared_ptr<torch::nn::Module> module, Forward forward, int64_t num_inputs)
    : module_(std::move(module)), num_inputs_(num_inputs) {
  TORCH_CHECK(module_ && forward, "Model needs a module and a forward function");
  forward_ = [forward = std::move(forward)](const ModelInputs& in) { return ModelOutput{forward(in), {}, "a tensor"}; };
}

Model::Model(std::shared_ptr<torch::nn::Module> module, OutputForward forward, int64_t num_inputs, bool takes_targets)
    : module_(std::move(module)), forward_(std::move(forward)), num_inputs_(num_inputs), takes_targets_(takes_targets) {
  TORCH_CHECK(module_ && forward_, "Model needs a module and a forward function");
}

torch::Tensor Model::forward(const ModelInputs& inputs) const {
  TORCH_CHECK(num_inputs_ < 0 || static_cast<int64_t>(inputs.size()) == num_inputs_, "The model's forward takes ",
              num_inputs_, " input", num_inputs_ == 1 ? "" : "s", takes_targets_ ? " (the targets last)" : "",
              " but the data has ", inputs.size());
  *last_ = forward_(inputs);
  // The prediction goes to the caller; keeping it here would hold a batch's activations one step longer.
  return std::exchange(last_->prediction, torch::Tensor());
}

ModelInputs Model::inputs_for(const data::Batch& batch) const {
  ModelInputs in = batch.inputs();
  if (takes_targets_) in.push_back(batch.y);
  return in;
}

void detail::throw_no_model_loss(const std::string& described) {
  throw OptionError("loss", Phrase::setting("loss", "model") + " does not fit: the model returns " + described +
                                ", with no loss (a dict's 'loss' entry, a scalar tensor, or a tuple's scalar first element)");
}

LossFn model_loss(const Model& model) {
  TORCH_CHECK(model.takes_targets(), "model_loss: the model does not take the targets, so it computes no loss");
  return [last = std::shared_ptr<const ModelOutput>(model.last_)](const torch::Tensor&, const torch::Tensor&) {
    const torch::Tensor& loss = last->loss;
    if (!loss.defined()) detail::throw_no_model_loss(last->described);
    TORCH_CHECK(loss.numel() == 1 && loss.is_floating_point(), "The model's loss is a ", loss.scalar_type(), " tensor of shape ",
                loss.sizes(), "; a loss is one floating-point number");
    // A half or bf16 loss (the model computed it under autocast) is scaled and logged in fp32, as fastai's to_float.
    return loss.reshape({}).to(torch::kFloat);
  };
}

std::vector<torch::Tensor> Model::state_tensors() const {
  std::vector<torch::Tensor> state;
  for (const auto& p : module_->parameters()) state.push_back(p.detach());
  for (const auto& b : module_->buffers()) state.push_back(b.detach());
  return state;
}

uint32_t Model::state_crc32() const {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& t : state_tensors()) {
    const torch::Tensor c = t.to(torch::kCPU).contiguous();
    crc = crc32(crc, static_cast<const Bytef*>(c.data_ptr()), static_cast<uInt>(c.nbytes()));
  }
  return static_cast<uint32_t>(crc);
}

} // namespace mixtrain
