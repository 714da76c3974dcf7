// A GAN trained by one Learner in (emulated on CPU) fp16 with dynamic loss
// scaling: the generator learns to produce samples from N(4, 0.5).
// fastai's to_fp16 is documented as broken for GANs; here each optimizer is
// checked and skipped on its own, with one scale update per batch.
//   gan_example [epochs]
#include <mixtrain/mixtrain.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

int run(int argc, char** argv) {
  const int64_t epochs = argc > 1 ? std::atoll(argv[1]) : 30;
  if (epochs < 1) {
    std::fprintf(stderr, "gan_example: error: epochs must be >= 1\n");
    return 2;
  }
  mixtrain::configure_threads(1);
  torch::manual_seed(0);
  namespace nn = torch::nn;

  // Real data: 1024 samples of N(4, 0.5). Targets are the "real" label, 1.
  torch::Tensor real = torch::randn({1024, 1}) * 0.5 + 4.0;
  mixtrain::data::Dataset ds{real, torch::ones({1024, 1})};
  auto dls = mixtrain::data::DataLoaders::from_split({ds, ds.head(256)}, 64, 0);

  nn::Sequential critic(nn::Linear(1, 32), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Linear(32, 1));
  nn::Sequential generator(nn::Linear(4, 32), nn::ReLU(), nn::Linear(32, 1));
  auto bce = [](const torch::Tensor& logits, const torch::Tensor& target) {
    return torch::nn::functional::binary_cross_entropy_with_logits(logits, target);
  };

  mixtrain::Learner learn(critic, dls, bce,
                          mixtrain::LearnerOptions().progress(false).opt_func(mixtrain::adamw(0.5, 0.99, 1e-5, 0.0)));
  auto gan = std::make_shared<mixtrain::callbacks::GANTrainer>(generator, /*noise_dim=*/4,
                                                               mixtrain::adamw(0.5, 0.99, 1e-5, 0.0), 2e-3);
  learn.add_cb(gan);
  // Start the scale far too high so that both optimizers visibly skip while it settles.
  learn.to_fp16(mixtrain::amp::GradScalerOptions().init_scale(16777216.0).growth_interval(50));

  const double mean_before = gan->sample(1000).mean().item<double>();
  learn.fit(epochs, 2e-3);
  const torch::Tensor samples = gan->sample(1000);

  int64_t g_skipped = 0;
  for (bool s : gan->generator_skipped()) g_skipped += s;
  auto mp = learn.precision_cb();
  std::printf("gan: %s fp16, %zu steps; critic skipped %lld, generator skipped %lld; final scale %.0f\n",
              mp->emulated() ? "emulated" : "CUDA", gan->generator_skipped().size(),
              static_cast<long long>(learn.recorder().skipped_steps()), static_cast<long long>(g_skipped),
              mp->loss_scale());
  std::printf("gan: generated mean %.3f -> %.3f (target 4.0), std %.3f (target 0.5)\n", mean_before,
              samples.mean().item<double>(), samples.std().item<double>());
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "gan_example: error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gan_example: error: %s\n", e.what());
  }
  return 2;
}
