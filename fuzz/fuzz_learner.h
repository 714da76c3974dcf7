#pragma once
// The small Learner both the checkpoint fuzz target and its seed writer use:
// a checkpoint only loads into a Learner of the same model and precision mode,
// so the seed must come from exactly this one.
#include <mixtrain/mixtrain.h>

#include <torch/torch.h>

#include <memory>

namespace mixtrain::fuzz {

inline std::unique_ptr<Learner> make_fuzz_learner() {
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({32, 4});
  torch::Tensor y = torch::randint(3, {32}, torch::kLong);
  data::Dataset ds{x, y};
  auto dls = data::DataLoaders(
      data::DataLoader(ds, data::DataLoaderOptions().batch_size(8).shuffle(true).drop_last(true).seed(1)),
      data::DataLoader(ds, data::DataLoaderOptions().batch_size(8)));
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  auto learn = std::make_unique<Learner>(Model(model), std::move(dls), cross_entropy(),
                                         LearnerOptions().progress(false));
  // fp16 (emulated on CPU): the checkpoint then also carries GradScaler state
  // and the scale history, the richest layout there is.
  learn->to_fp16();
  return learn;
}

} // namespace mixtrain::fuzz
