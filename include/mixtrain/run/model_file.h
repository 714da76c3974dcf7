#pragma once
/// The trained model as a file, and inference with it (fastai's export /
/// load_learner / predict).

#include "mixtrain/core/learner.h"

#include <cstdint>
#include <string>

namespace mixtrain {

/// Writes `model` to `path` atomically, with fp32 weights whatever precision
/// trained it. A model loaded from TorchScript is written as TorchScript
/// (Python's torch.jit.load reads it); a built-in model as a libtorch archive of
/// its parameters and buffers that records `builtin_name` (run/model_registry.h),
/// so load_model can rebuild it. Throws c10::Error for a native model without a
/// built-in name (save it with torch::save into your own module instead).
void save_model(const Model& model, const std::string& path, const std::string& builtin_name = "");

/// Loads a file written by save_model, or any TorchScript file, in eval mode.
/// A TorchScript model that returns a structure predicts with `output` (its
/// run's `output` in args.json; load_scripted_model's rule). Throws c10::Error
/// with one line naming the problem.
///
/// Example:
///   mixtrain::Model model = mixtrain::load_model("run/model.pt");
///   torch::Tensor logits = mixtrain::predict(model, {images});
Model load_model(const std::string& path, const std::string& output = "");

/// Runs `model` on `inputs` (dim 0 indexes samples; several tensors for a model
/// with several inputs) in eval mode, without gradients, in batches of
/// `batch_size`, and returns the predictions concatenated along dim 0. The
/// model's train/eval mode is restored afterwards.
torch::Tensor predict(const Model& model, const ModelInputs& inputs, int64_t batch_size = 256);

} // namespace mixtrain
