// GANs with one Learner: two models, two optimizers, each with its own
// unscale/skip under fp16 (emulated here), one scale update per batch.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;
namespace nn = torch::nn;

struct GanRun {
  double mean_before, mean_after;
  std::shared_ptr<callbacks::GANTrainer> gan;
  std::shared_ptr<PrecisionCallback> mp;
  int64_t critic_skips = 0;
  std::vector<bool> critic_skipped;
};

GanRun train_gan(bool fp16, int64_t epochs) {
  torch::manual_seed(0);
  torch::Tensor real = torch::randn({1024, 1}) * 0.5 + 4.0;
  data::Dataset ds{real, torch::ones({1024, 1})};
  auto dls = data::DataLoaders::from_split({ds, ds.head(256)}, 64, 0);
  nn::Sequential critic(nn::Linear(1, 32), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Linear(32, 1));
  nn::Sequential generator(nn::Linear(4, 32), nn::ReLU(), nn::Linear(32, 1));
  auto bce = [](const torch::Tensor& p, const torch::Tensor& t) {
    return nn::functional::binary_cross_entropy_with_logits(p, t);
  };
  Learner learn(critic, dls, bce, LearnerOptions().progress(false).opt_func(adamw(0.5, 0.99, 1e-5, 0.0)));
  auto gan = std::make_shared<callbacks::GANTrainer>(generator, 4, adamw(0.5, 0.99, 1e-5, 0.0), 2e-3);
  learn.add_cb(gan);
  if (fp16) learn.to_fp16(amp::GradScalerOptions().init_scale(16777216.0).growth_interval(50));
  GanRun r;
  r.mean_before = gan->sample(1000).mean().item<double>();
  learn.fit(epochs, 2e-3);
  r.mean_after = gan->sample(1000).mean().item<double>();
  r.gan = gan;
  r.mp = learn.precision_cb();
  r.critic_skips = learn.recorder().skipped_steps();
  for (const auto& s : learn.recorder().steps()) r.critic_skipped.push_back(s.skipped);
  return r;
}

TEST(GanTest, Fp16GanLearnsWithIndependentSkips) {
  torch::set_num_threads(1);
  GanRun r = train_gan(/*fp16=*/true, 30);
  EXPECT_GT(std::abs(r.mean_before - 4.0), 2.0);  // it starts far from the target
  EXPECT_NEAR(r.mean_after, 4.0, 0.5) << "before " << r.mean_before;
  ASSERT_NE(r.mp, nullptr);
  const auto& g = r.gan->generator_skipped();
  ASSERT_EQ(g.size(), r.critic_skipped.size());
  int64_t g_skips = 0, c_skips = 0, differ = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    g_skips += g[i];
    c_skips += r.critic_skipped[i];
    differ += g[i] != r.critic_skipped[i];
  }
  EXPECT_GT(g_skips, 0);
  EXPECT_GT(c_skips, 0);
  EXPECT_GT(differ, 0) << "the two optimizers never skipped independently";
  EXPECT_EQ(r.critic_skips, c_skips);
  EXPECT_LT(r.mp->loss_scale(), 16777216.0);
}

TEST(GanTest, Fp32GanLearnsWithoutAScaler) {
  torch::set_num_threads(1);
  GanRun r = train_gan(/*fp16=*/false, 30);
  EXPECT_NEAR(r.mean_after, 4.0, 0.5) << "before " << r.mean_before;
  EXPECT_EQ(r.mp, nullptr);
  for (bool s : r.gan->generator_skipped()) EXPECT_FALSE(s);
  EXPECT_THROW_WITH(callbacks::GANTrainer(nn::Sequential(nn::Linear(1, 1)), 0, adamw(), 1e-3), "Invalid noise_dim");
}

} // namespace
