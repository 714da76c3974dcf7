#pragma once
// The Learner the step benches (model_step_bench, step_ops) time: a built-in model or a
// TorchScript file taking images of shape `image` ([N, 1, 28, 28] by default), on random
// data of `train_batches` batches of `bs`, its threads where the model registry puts them
// (as `mixtrain train` does; `blas_override` "intra-op" or "blas" overrides), on
// `threads` (0: all cores), progress off, in `precision`. `core`: mixtrain::optim's AdamW,
// as `mixtrain train` steps every mode; else libtorch's.
//
// MODEL "transformer:LxD" is the built-in transformer with L blocks of width D (4 heads),
// for the small GPT ("transformer:4x256"); bench/python_step_ops.py builds the same.
#include <mixtrain/mixtrain.h>

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

/// "3x32x32" -> {3, 32, 32}; a malformed shape is an error that names it.
inline std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> dims;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t x = text.find('x', at);
    const std::string part = text.substr(at, x == std::string::npos ? std::string::npos : x - at);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || v <= 0)
      throw std::invalid_argument("'" + text + "' is not a shape like 3x32x32");
    dims.push_back(v);
    if (x == std::string::npos) break;
    at = x + 1;
  }
  return dims;
}

/// The built-in transformer at "transformer:LxD", else nullopt.
inline std::optional<mixtrain::models::TransformerOptions> transformer_spec(const std::string& name) {
  const std::string prefix = "transformer:";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const std::vector<int64_t> ld = parse_shape(name.substr(prefix.size()));
  if (ld.size() != 2) throw std::invalid_argument("'" + name + "' is not transformer:LAYERSxWIDTH");
  return mixtrain::models::TransformerOptions().layers(ld[0]).d_model(ld[1]);
}

inline std::unique_ptr<mixtrain::Learner> step_bench_learner(const std::string& name, int64_t train_batches, int64_t bs,
                                                             const std::string& precision, bool core,
                                                             const char* blas_override = nullptr,
                                                             const std::vector<int64_t>& image = {1, 28, 28},
                                                             int threads = 0) {
  const auto gpt = transformer_spec(name);
  const mixtrain::run::BuiltinModel* builtin = mixtrain::run::find_builtin_model(gpt ? "transformer" : name);
  const bool lm = builtin && builtin->data == mixtrain::run::DataKind::kText;
  const bool blas = blas_override ? std::string(blas_override) == "blas"
                                  : builtin && builtin->threads == mixtrain::ThreadPolicy::kBlas;
  mixtrain::configure_threads(threads, blas ? mixtrain::ThreadPolicy::kBlas : mixtrain::ThreadPolicy::kIntraOp);
  torch::manual_seed(0);
  mixtrain::Model model = gpt       ? mixtrain::Model(mixtrain::models::TransformerLM(*gpt))
                          : builtin ? builtin->build()
                                    : mixtrain::load_scripted_model(name);
  const int64_t n = train_batches * bs;
  mixtrain::data::Dataset train, valid;
  if (lm) {
    train = {torch::randint(0, 256, {n, 64}), torch::randint(0, 256, {n, 64})};
    valid = {torch::randint(0, 256, {bs, 64}), torch::randint(0, 256, {bs, 64})};
  } else {
    std::vector<int64_t> shape = {n};
    shape.insert(shape.end(), image.begin(), image.end());
    train = {torch::randn(shape), torch::randint(0, 10, {n})};
    shape[0] = bs;
    valid = {torch::randn(shape), torch::randint(0, 10, {bs})};
  }
  auto options = mixtrain::LearnerOptions().progress(false);
  if (core) options.opt_func(mixtrain::optim::factory(mixtrain::OptimizerSettings(), mixtrain::optim::Rounding()));
  auto learn = std::make_unique<mixtrain::Learner>(model, mixtrain::data::DataLoaders::from_split({train, valid}, bs, 0),
                                                   mixtrain::cross_entropy(), options);
  learn->set_precision(mixtrain::parse_precision(precision));
  return learn;
}

/// Runs a bench's `body`: an error (a model file that is not there, a bad precision) is one
/// line on stderr and exit status 1, not an abort with torch's backtrace.
template <typename Body>
int run_guarded(const char* program, Body body) {
  try {
    return body();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "%s: %s\n", program, what.substr(0, what.find('\n')).c_str());
    return 1;
  }
}

} // namespace bench
