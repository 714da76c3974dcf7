#pragma once
// The Learner the step benches (model_step_bench, step_ops) time: a built-in model or a
// TorchScript file taking [N, 1, 28, 28] images, on random data of `train_batches`
// batches of `bs`, its threads where the model registry puts them (as `mixtrain train`
// does; `blas_override` "intra-op" or "blas" overrides), progress off, in `precision`.
// `core`: mixtrain::optim's AdamW, as `mixtrain train` steps every mode; else libtorch's.
#include <mixtrain/mixtrain.h>

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

namespace bench {

inline std::unique_ptr<mixtrain::Learner> step_bench_learner(const std::string& name, int64_t train_batches, int64_t bs,
                                                             const std::string& precision, bool core,
                                                             const char* blas_override = nullptr) {
  const mixtrain::run::BuiltinModel* builtin = mixtrain::run::find_builtin_model(name);
  const bool lm = builtin && builtin->data == mixtrain::run::DataKind::kText;
  const bool blas = blas_override ? std::string(blas_override) == "blas"
                                  : builtin && builtin->threads == mixtrain::ThreadPolicy::kBlas;
  mixtrain::configure_threads(0, blas ? mixtrain::ThreadPolicy::kBlas : mixtrain::ThreadPolicy::kIntraOp);
  torch::manual_seed(0);
  mixtrain::Model model = builtin ? builtin->build() : mixtrain::load_scripted_model(name);
  const int64_t n = train_batches * bs;
  mixtrain::data::Dataset train, valid;
  if (lm) {
    train = {torch::randint(0, 256, {n, 64}), torch::randint(0, 256, {n, 64})};
    valid = {torch::randint(0, 256, {bs, 64}), torch::randint(0, 256, {bs, 64})};
  } else {
    train = {torch::randn({n, 1, 28, 28}), torch::randint(0, 10, {n})};
    valid = {torch::randn({bs, 1, 28, 28}), torch::randint(0, 10, {bs})};
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
