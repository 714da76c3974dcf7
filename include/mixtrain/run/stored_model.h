#pragma once
/// What a model stored in 16 bits asks for: the one rule both front ends follow.
///
/// - Every floating parameter bf16 (`model.to(torch.bfloat16)`): the user's pure-bf16
///   setup, trained as bf16-pure unless a precision is chosen.
/// - bf16 except whole modules kept in fp32 (Hugging Face's `_keep_in_fp32_modules`):
///   bf16-pure with those modules as fp32 islands.
/// - Every floating parameter fp16: refused in one line. Without an fp32 copy its
///   updates round away and its range overflows.
///
/// Python asks it for every model it is given, and the CLI for every model file it loads.
///
/// Example:
///   const auto stored = mixtrain::run::stored_model(*model.module);
///   const auto choice = mixtrain::run::choose_for_stored_model(stored, given_precision, given_keep_fp32,
///                                                                /*keeps_run_mode=*/false, /*diagnosing=*/false);
///   if (choice.precision) config.precision = *choice.precision;
#include "mixtrain/core/precision.h"
#include "mixtrain/util/phrase.h"

#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <vector>

namespace mixtrain::run {

/// One module's name (dotted, "" for the root) and the dtypes of its own floating
/// parameters, in the order the model lists them.
struct ModuleDtypes {
  std::string name;
  std::vector<c10::ScalarType> own;
};

/// How a model's floating parameters are stored.
struct StoredModel {
  /// kBFloat16 or kHalf when every floating parameter has that dtype.
  std::optional<c10::ScalarType> sixteen_bit;
  /// bf16 except these modules, whose own parameters are all fp32 (none otherwise).
  std::vector<std::string> fp32_modules;
  /// bf16 weights, whole or with fp32 modules: trained with bf16 values held in fp32
  /// storage while mixtrain runs it, each weight's dtype given back after.
  bool holds_bf16() const { return sixteen_bit == c10::ScalarType::BFloat16 || !fp32_modules.empty(); }
};

/// Reads `modules` (every module of the model, each with its own parameters).
StoredModel stored_model(const std::vector<ModuleDtypes>& modules);
/// Reads a model's modules and parameters.
StoredModel stored_model(const torch::nn::Module& model);

/// What the rule sets: the precision and keep_fp32 (unset where the caller chose, or
/// where nothing applies), and the notice saying so.
struct StoredModelChoice {
  std::optional<Precision> precision;
  std::optional<std::string> keep_fp32;  ///< comma-separated module names
  Phrase notice;                         ///< empty when nothing was chosen for the caller
};

/// What libtorch would report deep inside a run, said first, for both front ends: throws
/// OptionError("model") when the parameters are on the meta device, when every one is
/// frozen, or when any is float64 (mixtrain trains fp32 models in mixed precision).
void refuse_untrainable(const std::vector<torch::Tensor>& params);
/// Reads a model's parameters.
void refuse_untrainable(const torch::nn::Module& model);

/// Throws OptionError("model") for a model stored in fp16, whatever the precision: without
/// an fp32 copy its updates round away and its range overflows.
void refuse_fp16_storage(const StoredModel& model);

/// The rule. `precision_given` / `keep_fp32_given`: the caller set them;
/// `keeps_run_mode`: a branch from a run keeps that run's mode; `diagnosing`: the
/// notice says "diagnosing" rather than "training". Throws OptionError("model") for an
/// fp16 model.
StoredModelChoice choose_for_stored_model(const StoredModel& model, bool precision_given, bool keep_fp32_given,
                                          bool keeps_run_mode, bool diagnosing);

struct RunArgs;
enum class Command : unsigned;

/// The rule for a model file (the CLI): when `a` names a TorchScript file whose
/// parameters are bf16 and no precision was given, sets the precision (and keep_fp32,
/// unless given), records both in RunArgs::given, and says so once (mixtrain::warn).
/// A resume or a branch keeps its run's mode, and a model given by a front end
/// (RunArgs::model_source) was ruled on there. Throws OptionError("model") for an fp16
/// model; with a precision given, building the model refuses it. A file that does not
/// load is left to the model's own checks.
void choose_for_model_file(RunArgs& a, Command command);

/// A model whose weights are stored in bf16 (StoredModel::holds_bf16) trains with its
/// bf16 values in fp32 storage: exact, and what every precision mode takes (bf16-pure
/// stores them in bf16 again). Returns whether anything was widened.
bool widen_bf16_storage(torch::nn::Module& model);

} // namespace mixtrain::run
