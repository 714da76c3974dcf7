// Baseline (b): the same training as `mixtrain train` written as a plain libtorch
// loop: same model, data, AdamW hyper-parameters, one-cycle schedule (fastai's
// formula), batch order and thread settings, but no Learner and no callbacks.
// Prints one JSON line: {"seconds": epoch time (train + validate), "valid_accuracy": ...}.
#include <mixtrain/data/data.h>
#include <mixtrain/models/zoo.h>
#include <mixtrain/util/threads.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {
double cos_sched(double start, double end, double pos) { return start + (1 + std::cos(M_PI * (1 - pos))) * (end - start) / 2; }
double combined(double pct, double a, double b, double c, double pos) {
  return pos < pct ? cos_sched(a, b, pos / pct) : cos_sched(b, c, (pos - pct) / (1 - pct));
}
} // namespace

int main(int argc, char** argv) {
  const std::string data_dir = argc > 1 ? argv[1] : mixtrain::data::kFashionMnistDir;
  const int64_t bs = 256;
  const double lr_max = 3e-3;
  const uint64_t seed = 42;
  mixtrain::configure_threads(0);
  torch::manual_seed(seed);
  auto split = mixtrain::data::fashion_mnist(data_dir);
  auto model = mixtrain::models::simple_cnn();
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(lr_max).betas({0.95, 0.99}).eps(1e-5).weight_decay(0.01));
  auto gen = at::detail::createCPUGenerator(seed);

  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = split.train.size(), steps = n / bs;
  model->train();
  torch::Tensor order = torch::randperm(n, gen, torch::kLong);
  double loss_sum = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const double pos = static_cast<double>(i) / steps;
    auto& o = static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[0].options());
    o.lr(combined(0.25, lr_max / 25, lr_max, lr_max / 1e5, pos));
    o.betas({combined(0.25, 0.95, 0.85, 0.95, pos), 0.99});
    torch::Tensor idx = order.slice(0, i * bs, (i + 1) * bs);
    torch::Tensor x = split.train.x.index_select(0, idx), y = split.train.y.index_select(0, idx);
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    loss_sum += loss.item<double>();
  }
  model->eval();
  int64_t correct = 0;
  {
    torch::NoGradGuard no_grad;
    for (int64_t s = 0; s < split.valid.size(); s += bs) {
      torch::Tensor x = split.valid.x.slice(0, s, s + bs), y = split.valid.y.slice(0, s, s + bs);
      correct += model->forward(x).argmax(1).eq(y).sum().item<int64_t>();
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"seconds\": %.4f, \"valid_accuracy\": %.4f, \"train_loss\": %.4f}\n", seconds,
              static_cast<double>(correct) / split.valid.size(), loss_sum / steps);
  return 0;
}
