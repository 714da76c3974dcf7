#pragma once
/// The registry of built-in models: what each name builds and what it needs
/// (its default data, where the threads go). The only place that compares model
/// names; everything else asks the registry, so a TorchScript model gets the same
/// treatment as a built-in one wherever its data says it should (perplexity for
/// any sequence model, say).

#include "mixtrain/core/learner.h"
#include "mixtrain/util/threads.h"

#include <functional>
#include <string>
#include <vector>

namespace mixtrain::run {

/// What a model reads when no --data is given.
enum class DataKind {
  kImages,  ///< Fashion-MNIST's idx files, or a torch.save'd tensor file
  kText,    ///< a text file or folder, read as characters (data::text_corpus)
};

struct BuiltinModel {
  std::string name;         ///< "cnn", "mlp", "resnet", "transformer"
  std::string description;  ///< one line for --help
  std::function<Model()> build;
  DataKind data = DataKind::kImages;
  std::string default_data;  ///< where its data is when none is given
  ThreadPolicy threads = ThreadPolicy::kIntraOp;
};

/// Every built-in model, in the order help lists them.
const std::vector<BuiltinModel>& builtin_models();
/// The built-in model called `name`, or nullptr (then `name` is a TorchScript file).
const BuiltinModel* find_builtin_model(const std::string& name);
/// "cnn, mlp, resnet, transformer".
std::string builtin_model_list();
/// Builds the built-in model `name`; throws OptionError("model") naming the choices otherwise.
Model build_builtin_model(const std::string& name);

} // namespace mixtrain::run
