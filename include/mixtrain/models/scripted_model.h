#pragma once
/// Models exported from PyTorch: a TorchScript file (torch.jit.script or
/// torch.jit.trace, then .save) as a trainable mixtrain::Model.

#include "mixtrain/models/model.h"

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <unordered_set>

namespace torch::jit {
struct Module;
} // namespace torch::jit

namespace mixtrain {

/// The torch::nn::Module face of a TorchScript (sub)module: its parameters and
/// buffers are the script's own tensors (the same storage, so the optimizer,
/// checkpoints, master weights and data parallel change the script), and its
/// children mirror the script's submodules under their Python attribute names,
/// so parameter paths ("blocks.0.attn.qkv.weight") are the ones Python shows.
class ScriptedSubmodule : public torch::nn::Module {
 public:
  /// Registers `script`'s parameters, buffers and (recursively) children. A tensor that two
  /// modules share (a language model's tied embedding and head) is registered once, where it
  /// first appears: parameters() lists it once, so the optimizer steps it once, its gradient
  /// is unscaled once and a checkpoint holds it once; both modules' code still uses it.
  explicit ScriptedSubmodule(const torch::jit::Module& script);
  /// The same, skipping the tensors already in `registered` (the model's, so far).
  ScriptedSubmodule(const torch::jit::Module& script, const std::shared_ptr<std::unordered_set<const void*>>& registered);
  /// The Python class the submodule was scripted from ("torch.nn.modules.conv.Conv2d").
  const std::string& python_class() const { return python_class_; }

 private:
  std::string python_class_;
};

/// Loads the TorchScript file at `path` as a Model: forward takes the script's
/// inputs in order (several tensors for a model with several inputs), train()
/// and eval() reach the script. Throws c10::Error with one line naming the
/// problem: a missing file, a file that is not TorchScript (a state_dict
/// written by torch.save is not), parameters that are not floating point.
///
/// Example:
///   mixtrain::Model model = mixtrain::load_scripted_model("model.pt");
///   mixtrain::Learner learn(model, dls, mixtrain::cross_entropy());
///
/// A forward that returns a structure is trained on the prediction chosen from
/// it: `output` names a dict key or a tuple/namedtuple field, or gives a tuple or
/// list index ("1"); empty, it is a dict's "logits", else the first tensor of a
/// tuple, namedtuple or list (torchvision's, torchaudio's and Hugging Face's
/// outputs put the prediction first), said once in a notice. An output that does
/// not fit is a c10::Error naming what the model returns, on the first forward.
///
/// `computes_loss`: the model computes its own loss (Hugging Face's models given
/// labels): the Learner passes the targets as its last input, and the loss is a
/// dict's "loss" entry, a scalar tensor output, or a tuple's scalar first element
/// (Hugging Face's `(loss, logits)`); train it with model_loss(model).
///
/// Example:
///   mixtrain::Model model = mixtrain::load_scripted_model("hf_classifier.pt", "", true);
///   mixtrain::Learner learn(model, dls, mixtrain::model_loss(model));
Model load_scripted_model(const std::string& path, const std::string& output = "", bool computes_loss = false);

/// A TorchScript file's bytes as a module: libtorch's loader, read through a
/// bounded reader, then every parameter, buffer and attribute tensor checked against
/// the record the file holds for it (libtorch sizes a storage by what the file
/// claims). Throws c10::Error naming `path` for a damaged or foreign file.
torch::jit::Module parse_script(const std::string& bytes, const std::string& path);

/// The Model of a TorchScript module already in memory (Python's module object,
/// handed over by the Python front door): load_scripted_model without the file.
/// The Model trains `script` itself (its tensors, not copies). `name` names it in
/// errors.
Model scripted_model(torch::jit::Module script, const std::string& output = "", bool computes_loss = false,
                     const std::string& name = "the model");

/// Whether `model` came from load_scripted_model or scripted_model.
bool is_scripted(const Model& model);

/// Writes a scripted model as TorchScript to `path` (atomically), with its
/// floating-point parameters and buffers as fp32 whatever precision trained
/// it, so Python's torch.jit.load reads it back.
void save_scripted_model(const Model& model, const std::string& path);

} // namespace mixtrain
