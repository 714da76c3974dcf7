// bf16-pure against fp32 and bf16 autocast on the same MLP-with-LayerNorm steps,
// the weight-update rules against nearest, and the lost-update counting pass
// against a plain rounding pass. Every figure is a ratio measured in this run
// (this machine is noisy; each arm runs three times and keeps its best).
#include <mixtrain/mixtrain.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct NetImpl : torch::nn::Module {
  NetImpl() {
    for (int i = 0; i < 4; ++i) {
      fc.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(512, 512)));
      ln.push_back(register_module("ln" + std::to_string(i), torch::nn::LayerNorm(torch::nn::LayerNormOptions({512}))));
    }
    head = register_module("head", torch::nn::Linear(512, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < fc.size(); ++i) x = torch::relu(ln[i](fc[i](x)));
    return head(x);
  }
  std::vector<torch::nn::Linear> fc;
  std::vector<torch::nn::LayerNorm> ln;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

/// Milliseconds per training step of one fit (best of three).
double step_ms(mixtrain::Precision precision, mixtrain::amp::WeightUpdate rule) {
  auto x = torch::randn({4096, 512}), y = torch::randint(10, {4096});
  double best = 1e300;
  for (int rep = 0; rep < 3; ++rep) {
    torch::manual_seed(0);
    Net net;
    auto dls = mixtrain::data::DataLoaders::from_split({{x, y}, {x.slice(0, 0, 256), y.slice(0, 0, 256)}}, 256, 0);
    mixtrain::Learner learn(mixtrain::Model(net), dls, mixtrain::cross_entropy(), mixtrain::LearnerOptions().progress(false));
    learn.set_precision(precision, mixtrain::PrecisionOptions().weight_update(rule).rounding_seed(1));
    learn.fit(1, 1e-4);  // warm: the first fit allocates optimizer state
    const double t0 = now();
    learn.fit(1, 1e-4);
    best = std::min(best, 1e3 * (now() - t0) / 16);
  }
  return best;
}

} // namespace

int main() {
  mixtrain::configure_threads(0);
  using mixtrain::Precision;
  using mixtrain::amp::WeightUpdate;
  const double fp32 = step_ms(Precision::kFp32, WeightUpdate::kNearest);
  const double bf16 = step_ms(Precision::kBf16, WeightUpdate::kNearest);
  const double nearest = step_ms(Precision::kBf16Pure, WeightUpdate::kNearest);
  const double stochastic = step_ms(Precision::kBf16Pure, WeightUpdate::kStochastic);
  const double kahan = step_ms(Precision::kBf16Pure, WeightUpdate::kKahan);
  std::printf("step (4x Linear(512)+LayerNorm, bs 256): fp32 %.2f ms, bf16 %.2f ms, bf16-pure nearest %.2f ms\n", fp32,
              bf16, nearest);
  std::printf("bf16-pure step / fp32 step: %.2fx; / bf16 step: %.2fx\n", nearest / fp32, nearest / bf16);
  std::printf("stochastic / nearest: %.2fx (goal <= 1.10); kahan / nearest: %.2fx (goal <= 1.10)\n", stochastic / nearest,
              kahan / nearest);

  // The update pass alone on 4M weights: rounding with the lost-update counts
  // (round_update) against rounding without them (round_to_bf16_).
  torch::Tensor before = torch::randn({1 << 22}).to(torch::kBFloat16).to(torch::kFloat);
  const torch::Tensor fresh = before + torch::randn({1 << 22}) * 1e-3;
  double counted = 1e300, plain = 1e300;
  for (int rep = 0; rep < 7; ++rep) {
    torch::Tensor w = fresh.clone();
    double t0 = now();
    mixtrain::amp::round_update(w, before, WeightUpdate::kNearest, nullptr, 0, rep);
    counted = std::min(counted, now() - t0);
    w = fresh.clone();
    t0 = now();
    mixtrain::amp::round_to_bf16_(w);
    plain = std::min(plain, now() - t0);
  }
  // The step without counting: the counted pass's extra time, for this model's parameters, taken out.
  int64_t params = 0;
  for (const auto& p : Net()->parameters()) params += p.numel();
  const double extra_ms = 1e3 * (counted - plain) * static_cast<double>(params) / static_cast<double>(1 << 22);
  std::printf("update pass on 4M weights: counting %.2f ms, not counting %.2f ms (%.2fx); the bf16-pure step with "
              "counting / without: %.3fx (goal <= 1.05)\n",
              1e3 * counted, 1e3 * plain, counted / plain, nearest / (nearest - extra_ms));
  return 0;
}
