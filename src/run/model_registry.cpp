#include "mixtrain/run/model_registry.h"

#include "mixtrain/data/data.h"
#include "mixtrain/models/zoo.h"
#include "mixtrain/util/option_error.h"

namespace mixtrain::run {

const std::vector<BuiltinModel>& builtin_models() {
  static const std::vector<BuiltinModel> kModels = {
      {"cnn", "2 conv+BN layers", [] { return Model(models::simple_cnn()); }, DataKind::kImages, data::kFashionMnistDir,
       ThreadPolicy::kIntraOp},
      {"mlp", "784-256-10", [] { return Model(models::mlp()); }, DataKind::kImages, data::kFashionMnistDir,
       ThreadPolicy::kIntraOp},
      {"resnet", "residual CNN with BatchNorm", [] { return Model(models::resnet()); }, DataKind::kImages,
       data::kFashionMnistDir, ThreadPolicy::kIntraOp},
      // Its steps are mostly large matrix products: the threads go to OpenBLAS.
      {"transformer", "character-level decoder-only language model", [] { return Model(models::TransformerLM()); },
       DataKind::kText, data::kFortunesDir, ThreadPolicy::kBlas},
  };
  return kModels;
}

const BuiltinModel* find_builtin_model(const std::string& name) {
  for (const auto& m : builtin_models())
    if (m.name == name) return &m;
  return nullptr;
}

std::string builtin_model_list() {
  std::string out;
  for (const auto& m : builtin_models()) out += (out.empty() ? "" : ", ") + m.name;
  return out;
}

Model build_builtin_model(const std::string& name) {
  const BuiltinModel* m = find_builtin_model(name);
  if (!m) throw OptionError("model", "unknown " + Phrase::name("model") + " '" + name + "' (choices: " + builtin_model_list() + ")");
  return m->build();
}

} // namespace mixtrain::run
