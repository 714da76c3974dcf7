// Time to save and load a checkpoint (Learner::save / load, atomic write with
// fsync) for the reference CNN and for a ~100M-parameter model, against its size.
// Usage: checkpoint_bench [DIR]   (default: a directory under /tmp)
#include <mixtrain/mixtrain.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void measure(const char* name, torch::nn::Sequential model, torch::Tensor x, torch::Tensor y, const std::string& path) {
  auto dls = mixtrain::data::DataLoaders::from_split({{x, y}, {x, y}}, x.size(0), 0);
  mixtrain::Learner learn(model, dls, mixtrain::cross_entropy(), mixtrain::LearnerOptions().progress(false));
  learn.fit(1, 1e-3);  // optimizer state exists, as in a real checkpoint
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  double save = 1e9, load = 1e9;
  for (int r = 0; r < 3; ++r) {
    double t0 = now();
    learn.save(path);
    save = std::min(save, now() - t0);
    t0 = now();
    learn.load(path);
    load = std::min(load, now() - t0);
  }
  const double mb = std::filesystem::file_size(path) / 1e6;
  std::printf("%-10s %11lld params, file %8.1f MB: save %.3f s (%.0f MB/s), load %.3f s (%.0f MB/s)\n", name,
              static_cast<long long>(params), mb, save, mb / save, load, mb / load);
  std::filesystem::remove(path);
}
} // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  mixtrain::configure_threads(0);
  torch::manual_seed(0);
  measure("cnn", mixtrain::models::simple_cnn(), torch::randn({64, 1, 28, 28}), torch::randint(10, {64}),
          dir + "/mixtrain-bench-cnn.pt");
  // 6 x Linear(4096, 4096) = 100.7M parameters.
  torch::nn::Sequential big;
  for (int i = 0; i < 6; ++i) big->push_back(torch::nn::Linear(4096, 4096));
  measure("100M", big, torch::randn({8, 4096}), torch::randint(10, {8}), dir + "/mixtrain-bench-100m.pt");
  return 0;
}
