#pragma once
// The small Learners the checkpoint fuzz targets and their seed writers use: a
// checkpoint only loads into a Learner of the same model and precision mode, so the
// seed must come from exactly this one.
#include <mixtrain/amp/pure_bf16.h>
#include <mixtrain/mixtrain.h>
#include <mixtrain/optim/optimizers.h>

#include <torch/torch.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace mixtrain::fuzz {

/// fp16 (emulated on CPU): the checkpoint carries GradScaler state and the scale history.
/// `pure_bf16`: bf16-pure with Kahan rounding on the real bf16 forward (forced on any
/// CPU), whose checkpoints written inside a fit hold bf16 weights, bf16 optimizer state and
/// the optimizer's compensations. Both step mixtrain::optim's AdamW, so the optimizer's
/// archive has the rounding's keys too.
inline std::unique_ptr<Learner> make_fuzz_learner(bool pure_bf16) {
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({32, 4});
  torch::Tensor y = torch::randint(3, {32}, torch::kLong);
  data::Dataset ds{x, y};
  auto dls = data::DataLoaders(
      data::DataLoader(ds, data::DataLoaderOptions().batch_size(8).shuffle(true).drop_last(true).seed(1)),
      data::DataLoader(ds, data::DataLoaderOptions().batch_size(8)));
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  const auto rule = pure_bf16 ? amp::WeightUpdate::kKahan : amp::WeightUpdate::kNearest;
  auto learn = std::make_unique<Learner>(
      Model(model), std::move(dls), cross_entropy(),
      LearnerOptions().progress(false).opt_func(optim::factory(OptimizerSettings(), optim::Rounding().weight_update(rule))));
  if (pure_bf16) {
    ::setenv("MIXTRAIN_CPU_BF16", "1", 1);
    learn->set_precision(Precision::kBf16Pure, PrecisionOptions().weight_update(rule));
  } else {
    learn->to_fp16();
  }
  return learn;
}

/// Saves the Learner at the end of its first epoch, inside the fit (where bf16-pure holds
/// bf16 tensors), as a run's checkpoints are saved.
struct SaveAtFirstEpochEnd : Callback {
  explicit SaveAtFirstEpochEnd(std::string path) : path(std::move(path)) {}
  void after_epoch(Learner& learn) override {
    if (!saved) learn.save(path);
    saved = true;
  }
  std::string path;
  bool saved = false;
};

} // namespace mixtrain::fuzz
