// The smallest complete mixtrain program: data, model, Learner, fit_one_cycle.
//   quickstart               Fashion-MNIST (Debian's dataset-fashion-mnist), 1 epoch
//   quickstart --synthetic   three Gaussian blobs, for a quick check
#include <mixtrain/mixtrain.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  const bool synthetic = argc > 1 && std::strcmp(argv[1], "--synthetic") == 0;
  mixtrain::configure_threads();
  torch::manual_seed(42);

  mixtrain::data::DatasetSplit split;
  torch::nn::Sequential model;
  if (synthetic) {
    auto blobs = [](int64_t n) {
      torch::Tensor y = torch::randint(3, {n}, torch::kLong);
      torch::Tensor centers = torch::tensor({{3.f, 0.f}, {-3.f, 0.f}, {0.f, 3.f}});
      return mixtrain::data::Dataset{centers.index_select(0, y) + torch::randn({n, 2}), y};
    };
    split = {blobs(1024), blobs(256)};
    model = torch::nn::Sequential(torch::nn::Linear(2, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  } else {
    split = mixtrain::data::fashion_mnist();
    model = mixtrain::models::simple_cnn();
  }

  mixtrain::Learner learn(model, mixtrain::data::DataLoaders::from_split(split, synthetic ? 64 : 256, 42),
                          mixtrain::cross_entropy(), mixtrain::LearnerOptions().metrics({mixtrain::accuracy()}));
  learn.fit_one_cycle(synthetic ? 3 : 1, synthetic ? 1e-2 : 3e-3);
  std::printf("quickstart: valid accuracy %.4f\n", learn.recorder().values().back().metrics[0]);
  return 0;
}
