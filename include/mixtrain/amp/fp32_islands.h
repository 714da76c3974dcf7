#pragma once
/// fp32 islands: named modules computed in fp32 while the rest of the model runs
/// in fp16 or bf16 (Hugging Face's `_keep_in_fp32_modules`, as a precision
/// option: PrecisionOptions::keep_fp32, `--keep-fp32`). The module boundary
/// decides (mixtrain/module_scope.h), not parameter ownership: an attention
/// score matmul or a residual add inside the module is in the island too.
///
/// - Emulated autocast (fp16 on a CPU, bf16 on a CPU without bf16 units): an
///   island's ops run in fp32 on their inputs as they are, and their results are
///   fp32, so the ops after the island see fp32 tensors and the usual promotion applies.
/// - Real autocast (CUDA, a CPU's bf16): the dispatcher mode sits above the Autocast
///   keys, so an island's op skips them: its half/bf16 inputs are cast to fp32 and it
///   computes in fp32, with the same result rule.
/// - Master weights: an island's parameters stay fp32 (as norm layers'), and its
///   ops compute in fp32 on the half/bf16 activations, returning the model's dtype.

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace torch::nn { class Module; }

namespace mixtrain::amp {

/// The parameters (by TensorImpl) of the modules of `model` that `patterns` match.
using IslandParams = std::unordered_set<const void*>;
IslandParams island_params(const std::vector<std::string>& patterns, const torch::nn::Module& model);

/// RAII: while alive, this thread's emulation, master-weights and autocast modes
/// keep the modules matching `patterns` in fp32. Nestable (the innermost applies).
class Fp32Islands {
 public:
  /// `params` (island_params, worked out once, not per batch) adds parameter
  /// ownership: an op that takes a parameter of a matching module is in the island
  /// even where no scope names it (a C++ module whose forward opens no ModuleScope).
  explicit Fp32Islands(std::vector<std::string> patterns, std::shared_ptr<const IslandParams> params = nullptr);
  ~Fp32Islands();
  Fp32Islands(const Fp32Islands&) = delete;
  Fp32Islands& operator=(const Fp32Islands&) = delete;

 private:
  friend std::unique_ptr<Fp32Islands> keep_fp32(const torch::nn::Module& model, const std::vector<std::string>& patterns);

  std::vector<std::string> patterns_;
  std::shared_ptr<const IslandParams> params_;
  const std::vector<std::string>* previous_;
  const std::unordered_set<const void*>* previous_params_;
  std::shared_ptr<void> mode_;  // includes the dispatcher key the islands' ops are caught on
  // keep_fp32's: the islands' bf16/fp16 parameters and buffers held in fp32, given their
  // dtypes back when this is released; and whether island ops return the model's dtype.
  std::shared_ptr<void> held_;
  bool previous_cast_back_ = false;
};

/// keep_fp32 for a hand-written libtorch loop: the modules of `model` that `patterns` name
/// stay fp32 on this thread while the returned guard lives, by module scope and by ownership
/// of their parameters and buffers (a C++ module's forward opens no scope: the ops that take an
/// island's tensors are the island). The names are checked first (check_islands: one
/// OptionError naming the closest paths). Two kinds of loop:
/// - Under autocast (amp::autocast: fp16 or bf16, CPU or CUDA) or the emulation, on an fp32
///   model: the island's ops skip autocast and compute in fp32; their results are fp32.
/// - A model stored in bf16 or fp16 (`model->to(torch::kBFloat16)`, no autocast), as a Hugging
///   Face model loaded in bfloat16: the islands' parameters and buffers become fp32 tensors
///   (the same tensor objects, so an optimizer made before or after steps them), an island's op
///   casts its bf16/fp16 inputs to fp32, computes in fp32 and returns the model's dtype, as
///   Python's mixtrain.keep_fp32 leaves such a model. Releasing the guard gives each tensor its
///   dtype back (rounded). The granularity is the op: a C++ island module of several ops
///   rounds between them, where a Python island rounds only its output.
/// Make it once, before the loop: it lives across forward and backward.
///
/// Example:
///   auto islands = mixtrain::amp::keep_fp32(*model, {"proj"});
///   mixtrain::amp::autocast fp16(torch::kCUDA, torch::kHalf);
///   auto loss = loss_fn(model->forward(x), y);
std::unique_ptr<Fp32Islands> keep_fp32(const torch::nn::Module& model, const std::vector<std::string>& patterns);

/// The module paths of `model` (named_modules, the root left out) that `patterns`
/// keep in fp32. Throws OptionError("keep_fp32") for an empty name, a pattern
/// matching no module (naming the closest paths), or one matching every module.
std::vector<std::string> check_islands(const std::vector<std::string>& patterns, const std::vector<std::string>& module_paths);
/// The same against the module paths of `model`.
std::vector<std::string> check_islands(const std::vector<std::string>& patterns, const torch::nn::Module& model);

} // namespace mixtrain::amp
