// Mixed-precision micro-benchmarks (ratios against baselines measured in the same run):
//  1. fused CPU unscale vs in-place mul_ vs naive mul_ + isfinite().all(), on 64M floats;
//  2. GradScaler overhead per step on the reference CNN: fp32 with vs without the scaler;
//  3. fp16 emulation slow-down per CNN step: emulated fp16 + scaler vs fp32 + scaler.
// Usage: amp_bench [--quick]
#include <mixtrain/amp/fp16_emulation.h>
#include <mixtrain/amp/grad_scaler.h>
#include <mixtrain/amp/unscale.h>
#include <mixtrain/models.h>
#include <mixtrain/threads.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

namespace {
double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
} // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int threads = mixtrain::configure_threads(0);
  std::printf("threads %d\n", threads);

  // 1. Bandwidth: each pass reads and writes 4 bytes per element.
  const int64_t n = quick ? (int64_t(1) << 22) : (int64_t(64) << 20);
  torch::Tensor g = torch::randn({n});
  const int rounds = quick ? 3 : 7;
  std::vector<double> t_mul, t_fused, t_naive;
  for (int r = 0; r < rounds; ++r) {  // interleaved rounds: noise hits all three alike
    t_mul.push_back(seconds([&] { g.mul_(1.0f); }));
    t_fused.push_back(seconds([&] { mixtrain::amp::non_finite_check_and_unscale_cpu({g}, 1.0000001f); }));
    t_naive.push_back(seconds([&] {
      g.mul_(1.0f);
      (void)torch::isfinite(g).all().item<bool>();
    }));
  }
  const double gb = 2.0 * 4.0 * n / 1e9;
  const double bw_mul = gb / median(t_mul), bw_fused = gb / median(t_fused), bw_naive = gb / median(t_naive);
  std::printf("unscale %lld floats: mul_ %.1f GB/s, fused %.1f GB/s, naive %.1f GB/s; fused/mul_ = %.2f (goal >= 0.70)\n",
              static_cast<long long>(n), bw_mul, bw_fused, bw_naive, bw_fused / bw_mul);

  // 2. Scaler overhead: the same CNN steps with and without scale/step/update.
  torch::manual_seed(0);
  auto model = mixtrain::models::simple_cnn();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).betas({0.9, 0.99}).eps(1e-5));
  mixtrain::amp::GradScaler scaler;
  const torch::Tensor x = torch::randn({256, 1, 28, 28}), y = torch::randint(10, {256});
  auto plain_step = [&] {
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt.step();
    opt.zero_grad();
  };
  auto scaled_step = [&] {
    scaler.scale(torch::nn::functional::cross_entropy(model->forward(x), y)).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
  };
  auto emulated_step = [&] {
    torch::Tensor loss;
    {
      mixtrain::amp::Fp16Emulation fp16;  // the forward region, as MixedPrecision opens it
      loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
  };
  const int steps = quick ? 5 : 40;
  for (int i = 0; i < 3; ++i) { plain_step(); scaled_step(); emulated_step(); }  // warm-up
  std::vector<double> t_plain, t_scaled, t_emulated;
  for (int r = 0; r < (quick ? 2 : 5); ++r) {
    t_plain.push_back(seconds([&] { for (int i = 0; i < steps; ++i) plain_step(); }) / steps);
    t_scaled.push_back(seconds([&] { for (int i = 0; i < steps; ++i) scaled_step(); }) / steps);
    t_emulated.push_back(seconds([&] { for (int i = 0; i < steps; ++i) emulated_step(); }) / steps);
  }
  const double p = median(t_plain), s = median(t_scaled), e = median(t_emulated);
  std::printf("CNN step (bs 256): fp32 %.2f ms, fp32 + GradScaler %.2f ms; overhead %.1f%% (goal <= 3%%)\n", p * 1e3,
              s * 1e3, (s / p - 1) * 100);
  std::printf("CNN step (bs 256): emulated fp16 + GradScaler %.2f ms; slow-down %.2fx vs fp32 + GradScaler\n",
              e * 1e3, e / s);
  return 0;
}
