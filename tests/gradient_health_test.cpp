// Gradient health: the fractions of gradient elements fp16 would flush to zero
// or overflow at a given loss scale.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;
class GradientHealthTest : public test::SeededTest {};

TEST_F(GradientHealthTest, CountsUnderflowAndOverflowAtTheScale) {
  torch::nn::Linear lin(2, 2);  // weight: 4 elements, bias: 2
  lin->weight.mutable_grad() = torch::tensor({{1e-9f, 1e-3f}, {0.f, 2.f}});
  lin->bias.mutable_grad() = torch::tensor({1e-12f, 5.f});
  // At scale 1: 1e-9 and 1e-12 flush (below 2^-25); nothing overflows. 5 nonzero elements.
  auto h = diagnose::gradient_health(*lin, 1.0);
  EXPECT_EQ(h.nonzero, 5);
  EXPECT_DOUBLE_EQ(h.underflow, 2.0 / 5);
  EXPECT_DOUBLE_EQ(h.overflow, 0.0);
  // At 2^16: 1e-9 * 65536 = 6.6e-5 survives, 1e-12 * 65536 = 6.6e-8 survives (above 2^-25);
  // 5 * 65536 overflows and 2 * 65536 overflows.
  h = diagnose::gradient_health(*lin, 65536.0);
  EXPECT_DOUBLE_EQ(h.underflow, 0.0);
  EXPECT_DOUBLE_EQ(h.overflow, 2.0 / 5);
  // Worst underflow first, per parameter.
  h = diagnose::gradient_health(*lin, 1.0);
  ASSERT_EQ(h.params.size(), 2u);
  EXPECT_EQ(h.params[0].name, "bias");
  EXPECT_DOUBLE_EQ(h.params[0].underflow, 0.5);
  EXPECT_DOUBLE_EQ(h.params[0].max_abs, 5.0);
}

TEST_F(GradientHealthTest, MeasureGradientsLeavesTheModelsGradsAndStatsAlone) {
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::Linear(8, 3));
  auto ds = test::blobs(32, 3, 4);
  auto dls = data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)),
                               data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)));
  Learner learn(Model(net), std::move(dls), cross_entropy(), LearnerOptions().progress(false));
  const torch::Tensor running_mean = net[1]->as<torch::nn::BatchNorm1dImpl>()->running_mean.clone();
  const auto h = diagnose::measure_gradients(learn, {ds.x, ds.y}, 1e-8);
  EXPECT_GT(h.nonzero, 50);
  EXPECT_GT(h.underflow, 0.5);  // ordinary gradients times 1e-8 mostly flush to zero
  EXPECT_EQ(h.overflow, 0.0);
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_TRUE(torch::equal(running_mean, net[1]->as<torch::nn::BatchNorm1dImpl>()->running_mean));
  EXPECT_LT(diagnose::measure_gradients(learn, {ds.x, ds.y}, 65536).underflow, 0.01);
}

} // namespace
