// The stored-model rule (mixtrain/run/stored_model.h): what a bf16 or fp16 model asks for.
#include "mixtrain/run/stored_model.h"

#include "mixtrain/models/scripted_model.h"
#include "mixtrain/run/model_registry.h"
#include "mixtrain/run/options.h"
#include "mixtrain/util/option_error.h"
#include "mixtrain/util/warnings.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <set>

namespace mixtrain::run {

StoredModel stored_model(const std::vector<ModuleDtypes>& modules) {
  StoredModel out;
  std::set<c10::ScalarType> dtypes;
  for (const auto& m : modules) dtypes.insert(m.own.begin(), m.own.end());
  if (dtypes.size() == 1 && (*dtypes.begin() == c10::ScalarType::BFloat16 || *dtypes.begin() == c10::ScalarType::Half)) {
    out.sixteen_bit = *dtypes.begin();
    return out;
  }
  if (dtypes != std::set<c10::ScalarType>{c10::ScalarType::BFloat16, c10::ScalarType::Float}) return out;
  // Islands: named modules whose own parameters are all fp32. Every fp32 parameter must
  // be an island's: an fp32 parameter beside bf16 ones in one module is a mix, not an island.
  std::vector<std::string> islands;
  for (const auto& m : modules) {
    const bool all_fp32 = std::all_of(m.own.begin(), m.own.end(), [](c10::ScalarType t) { return t == c10::ScalarType::Float; });
    const bool any_fp32 = std::any_of(m.own.begin(), m.own.end(), [](c10::ScalarType t) { return t == c10::ScalarType::Float; });
    if (!m.name.empty() && !m.own.empty() && all_fp32)
      islands.push_back(m.name);
    else if (any_fp32)
      return out;
  }
  out.fp32_modules = std::move(islands);
  return out;
}

StoredModel stored_model(const torch::nn::Module& model) {
  std::vector<ModuleDtypes> modules;
  for (const auto& item : model.named_modules()) {
    ModuleDtypes m{item.key(), {}};
    for (const auto& p : item.value()->parameters(/*recurse=*/false))
      if (p.is_floating_point()) m.own.push_back(p.scalar_type());
    modules.push_back(std::move(m));
  }
  return stored_model(modules);
}

void refuse_untrainable(const std::vector<torch::Tensor>& params) {
  const auto any = [&](auto&& pred) { return std::any_of(params.begin(), params.end(), pred); };
  if (any([](const torch::Tensor& p) { return p.is_meta(); }))
    throw OptionError("model", Phrase("the model's parameters are on the meta device (they hold no values): materialize "
                                      "them first (to_empty on a device and initialize them, or load a state_dict "
                                      "with assign)"));
  if (!params.empty() && !any([](const torch::Tensor& p) { return p.requires_grad(); }))
    throw OptionError("model", Phrase("every parameter of the model is frozen (requires_grad=False): there is nothing "
                                      "to train; unfreeze the ones to train (requires_grad_(True))"));
  if (any([](const torch::Tensor& p) { return p.scalar_type() == c10::ScalarType::Double; }))
    throw OptionError("model", Phrase("the model's parameters are float64: mixtrain trains fp32 models (in mixed "
                                      "precision); pass model.float()"));
}

void refuse_untrainable(const torch::nn::Module& model) { refuse_untrainable(model.parameters()); }

void refuse_fp16_storage(const StoredModel& model) {
  if (model.sixteen_bit == c10::ScalarType::Half)
    throw OptionError("model", Phrase("the model's parameters are fp16, which mixtrain does not train without an fp32 copy "
                                      "(its updates round away and its range overflows); pass model.float() with ") +
                                   Phrase::setting("precision", "fp16") + " (autocast), or model.to(torch.bfloat16) for " +
                                   Phrase::setting("precision", "bf16-pure"));
}

StoredModelChoice choose_for_stored_model(const StoredModel& model, bool precision_given, bool keep_fp32_given,
                                          bool keeps_run_mode, bool diagnosing) {
  StoredModelChoice out;
  refuse_fp16_storage(model);
  if (precision_given || keeps_run_mode || !model.holds_bf16()) return out;
  const std::string doing = diagnosing ? "diagnosing" : "training";
  out.precision = Precision::kBf16Pure;
  if (model.fp32_modules.empty()) {
    out.notice = "the model's parameters are bf16: " + doing +
                 " it as bf16-pure (bf16 weights, gradients and optimizer state, no fp32 copy); set " +
                 Phrase::name("precision") + " to choose another mode";
    return out;
  }
  std::string islands;
  for (const auto& name : model.fp32_modules) islands += (islands.empty() ? "" : ",") + name;
  if (!keep_fp32_given) out.keep_fp32 = islands;
  const size_t n = model.fp32_modules.size();
  std::string listed;
  for (const auto& name : model.fp32_modules) listed += (listed.empty() ? "" : ", ") + name;
  out.notice = "the model's parameters are bf16 except " + std::to_string(n) + (n == 1 ? " module" : " modules") +
               " kept in fp32 (" + listed + "), as Hugging Face's _keep_in_fp32_modules leaves them: " + doing +
               " it as bf16-pure" +
               (keep_fp32_given ? Phrase() : " with " + Phrase::setting("keep_fp32", islands)) + "; set " +
               Phrase::name("precision") + " to choose another mode";
  return out;
}

void choose_for_model_file(RunArgs& a, Command command) {
  const RunConfig& r = a.config;
  const RunArgs defaults = defaults_for(command);
  const auto given = [&](const std::string& key) { return was_given(*find_option(key), a, defaults); };
  std::error_code ec;
  // A chosen precision leaves nothing to choose (an fp16 model is refused where it is
  // built, build_model), and a model that is not a file was ruled on by its front end.
  if (given("precision") || a.model_source || !a.resume.empty() || !a.from_run.empty() || find_builtin_model(r.model) ||
      !std::filesystem::is_regular_file(r.model, ec))
    return;
  std::optional<Model> model;
  try {
    model = load_scripted_model(r.model, r.output, r.loss == LossKind::kModel);
  } catch (const c10::Error&) {
    return;  // not a model: build_model says what is wrong, in its words
  }
  const StoredModelChoice c = choose_for_stored_model(stored_model(*model->ptr()), /*precision_given=*/false,
                                                      given("keep_fp32"), /*keeps_run_mode=*/false,
                                                      command == Command::kDoctor);
  // Recorded as given, so that a second ask (the CLI asks before its warnings, run::train
  // again) reads the choice and loads nothing.
  if (c.precision) {
    a.config.precision = *c.precision;
    a.given.push_back("precision");
  }
  if (c.keep_fp32) {
    find_option("keep_fp32")->set(a, *c.keep_fp32);
    a.given.push_back("keep_fp32");
  }
  if (!c.notice.empty()) warn(c.notice);
}

bool widen_bf16_storage(torch::nn::Module& model) {
  if (!stored_model(model).holds_bf16()) return false;
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters())
    if (p.scalar_type() == torch::kBFloat16) p.set_data(p.to(torch::kFloat));
  for (auto& b : model.buffers())
    if (b.scalar_type() == torch::kBFloat16) b.set_data(b.to(torch::kFloat));
  return true;
}

} // namespace mixtrain::run
