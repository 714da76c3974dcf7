// Written against mixtrain 0.1.0's README: the header paths before the layers
// had folders, amp::Fp16Emulation (now ReducedPrecisionEmulation) and
// amp::PrecisionCallback (now core's mixtrain::PrecisionCallback). 0.2.0 keeps
// them as forwarding headers and [[deprecated]] aliases (CHANGELOG.md).
#include <mixtrain/amp/fp16_emulation.h>
#include <mixtrain/amp/precision_callback.h>
#include <mixtrain/data.h>
#include <mixtrain/learner.h>
#include <mixtrain/models.h>
#include <mixtrain/precision.h>
#include <mixtrain/threads.h>
#include <torch/torch.h>

#include <cstdio>

int main() {
  mixtrain::configure_threads(1);
  torch::manual_seed(0);
  {
    mixtrain::amp::Fp16Emulation emulation;  // fp16 numerics on CPU, as the README showed
    const torch::Tensor x = torch::full({2, 2}, 1.0 + 1.0 / 4096);
    const torch::Tensor y = torch::matmul(x, x);  // an fp16-list op: rounded through half
    std::printf("previous_release: emulated matmul %.6f\n", y[0][0].item<double>());
  }
  auto blobs = [](int64_t n) {
    torch::Tensor y = torch::randint(2, {n}, torch::kLong);
    return mixtrain::data::Dataset{y.to(torch::kFloat).unsqueeze(1).repeat({1, 2}) * 4 - 2 + torch::randn({n, 2}), y};
  };
  mixtrain::data::DatasetSplit split{blobs(256), blobs(64)};
  mixtrain::Learner learn(torch::nn::Linear(2, 2), mixtrain::data::DataLoaders::from_split(split, 32, 42),
                          mixtrain::cross_entropy(),
                          mixtrain::LearnerOptions().metrics({mixtrain::accuracy()}).progress(false));
  learn.to_fp16(mixtrain::amp::GradScalerOptions().init_scale(256));
  std::shared_ptr<mixtrain::amp::PrecisionCallback> pc = learn.precision_cb();
  learn.fit_one_cycle(2, 1e-1);
  std::printf("previous_release: precision %s, scale %g, valid accuracy %.4f\n",
              mixtrain::precision_name(learn.precision()).c_str(), pc->loss_scale(),
              learn.recorder().values().back().metrics[0]);
  return 0;
}
