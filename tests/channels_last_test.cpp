// Channels-last activations in the built-in image models (models/channels_last.h): the layout
// they run in, torch's bits on that layout, parameters and gradients that stay in the default
// layout, and gradients that come back in the layout each module was given.
#include "test_util.h"

#include <mixtrain/mixtrain.h>
#include <mixtrain/models/channels_last.h>

#include <vector>

namespace {

using namespace mixtrain;
namespace nn = torch::nn;

constexpr auto kChannelsLast = torch::MemoryFormat::ChannelsLast;

class ChannelsLastTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!models::channels_last_activations()) GTEST_SKIP() << "MIXTRAIN_CONTIGUOUS_CONV=1 keeps the default layout";
    torch::manual_seed(0);
  }
};

bool runs_channels_last(const torch::Tensor& t) { return t.suggest_memory_format() == kChannelsLast; }

TEST_F(ChannelsLastTest, TheConvolutionRunsChannelsLastWithTorchsBitsAndDefaultLayoutParameters) {
  const auto options = nn::Conv2dOptions(16, 32, 3).stride(2).padding(1).bias(false);
  models::ChannelsLastConv2d ours(options);
  nn::Conv2d torchs(options);
  {
    torch::NoGradGuard no_grad;
    torchs->weight.copy_(ours->weight);
  }
  const torch::Tensor x = torch::randn({8, 16, 14, 14}).requires_grad_(true);
  const torch::Tensor x_cl = x.detach().contiguous(kChannelsLast).requires_grad_(true);
  const torch::Tensor y = ours(x);
  const torch::Tensor expected = torchs(x_cl);
  EXPECT_TRUE(runs_channels_last(y));
  EXPECT_TRUE(torch::equal(y, expected));

  const torch::Tensor g = torch::randn(y.sizes());
  y.backward(g);
  expected.backward(g);
  EXPECT_TRUE(torch::equal(x.grad(), x_cl.grad()));
  EXPECT_TRUE(x.grad().is_contiguous());  // the caller's layout, back through the copy
  EXPECT_TRUE(torch::equal(ours->weight.grad(), torchs->weight.grad()));
  EXPECT_TRUE(ours->weight.is_contiguous());
  EXPECT_TRUE(ours->weight.grad().is_contiguous());
}

TEST_F(ChannelsLastTest, OneChannelImagesAreRestridedNotCopied) {
  const torch::Tensor images = torch::randn({4, 1, 28, 28});
  const torch::Tensor restrided = models::to_channels_last(images);
  EXPECT_TRUE(runs_channels_last(restrided));
  EXPECT_EQ(restrided.data_ptr(), images.data_ptr());
  EXPECT_TRUE(torch::equal(restrided, images));

  // A one-channel tensor that needs its gradient is copied: the gradient comes back whole.
  const torch::Tensor x = images.clone().requires_grad_(true);
  const torch::Tensor copied = models::to_channels_last(x);
  EXPECT_TRUE(runs_channels_last(copied));
  EXPECT_NE(copied.data_ptr(), x.data_ptr());
  (copied * 3).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full_like(x, 3)));

  // Already channels-last, or not an image batch: the same tensor.
  const torch::Tensor cl = torch::randn({2, 3, 4, 5}).contiguous(kChannelsLast);
  EXPECT_TRUE(models::to_channels_last(cl).is_same(cl));
  const torch::Tensor flat = torch::randn({2, 3});
  EXPECT_TRUE(models::to_channels_last(flat).is_same(flat));
}

TEST_F(ChannelsLastTest, TheFlattenGivesTheGradientBackInTheLayoutItWasGiven) {
  models::ChannelsLastFlatten ours;
  const torch::Tensor leaf = torch::randn({4, 8, 3, 3}).contiguous(kChannelsLast).requires_grad_(true);
  // The gradient as the layer before receives it (a leaf's .grad is restrided to the leaf).
  const torch::Tensor x = leaf * 1;
  torch::Tensor arrived;
  x.register_hook([&arrived](const torch::Tensor& g) { arrived = g; });
  const torch::Tensor y = ours(x);
  EXPECT_TRUE(torch::equal(y, torch::flatten(x.detach(), 1)));
  const torch::Tensor g = torch::randn(y.sizes());
  y.backward(g);
  ASSERT_TRUE(arrived.defined());
  EXPECT_TRUE(runs_channels_last(arrived));
  EXPECT_TRUE(torch::equal(arrived, g.view(x.sizes())));

  // Differentiable twice (a gradient penalty through it).
  const torch::Tensor w = torch::randn(y.size(1));
  const torch::Tensor x2 = leaf.detach().clone(kChannelsLast).requires_grad_(true);
  const torch::Tensor out = (ours(x2).pow(2) * w).sum();
  const torch::Tensor gx = torch::autograd::grad({out}, {x2}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  const torch::Tensor penalty = gx.pow(2).sum();
  penalty.backward();
  // d/dx of sum((2 x w)^2) = 8 x w^2, with w laid out as x.
  const torch::Tensor w_as_x = w.view({1, 8, 3, 3});
  EXPECT_TRUE(torch::allclose(x2.grad(), 8 * x2.detach() * w_as_x.pow(2), 1e-5, 1e-6));
}

TEST_F(ChannelsLastTest, TheBuiltInCnnIsTorchsModulesOnAChannelsLastBatch) {
  // The CNN's training forward and its gradients are what torch's own modules give the
  // same state on a channels-last batch, to the bit; its activations run channels-last.
  nn::Sequential cnn = models::simple_cnn();
  nn::Sequential torchs(nn::Conv2d(nn::Conv2dOptions(1, 16, 3).stride(2).padding(1).bias(false)),
                        nn::BatchNorm2d(16), nn::ReLU(),
                        nn::Conv2d(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1).bias(false)),
                        nn::BatchNorm2d(32), nn::ReLU(), nn::Flatten(), nn::Linear(32 * 7 * 7, 10));
  {
    torch::NoGradGuard no_grad;
    const auto ours = cnn->named_parameters();
    for (const auto& p : torchs->named_parameters()) p.value().copy_(ours[p.key()]);
  }
  const torch::Tensor x = torch::randn({16, 1, 28, 28});
  const torch::Tensor x_cl = torch::empty(x.sizes(), x.options().memory_format(kChannelsLast)).copy_(x);
  const torch::Tensor y = cnn->forward(x);
  const torch::Tensor expected = torchs->forward(x_cl);
  EXPECT_TRUE(torch::equal(y, expected));
  const torch::Tensor g = torch::randn(y.sizes());
  y.backward(g);
  expected.backward(g);
  const auto theirs = torchs->named_parameters();
  for (const auto& p : cnn->named_parameters()) {
    SCOPED_TRACE(p.key());
    EXPECT_TRUE(p.value().is_contiguous());
    EXPECT_TRUE(p.value().grad().is_contiguous());
    EXPECT_TRUE(torch::equal(p.value().grad(), theirs[p.key()].grad()));
  }
  for (const auto& b : cnn->named_buffers()) EXPECT_TRUE(torch::equal(b.value(), torchs->named_buffers()[b.key()]));
}

TEST_F(ChannelsLastTest, TheBuiltInImageModelsActivationsRunChannelsLast) {
  // Every image-shaped activation from the first convolution on, in both models.
  const torch::Tensor x = torch::randn({4, 1, 28, 28});
  for (nn::Sequential model : {models::simple_cnn(), models::resnet()}) {
    torch::Tensor a = x;
    int64_t images = 0;
    for (auto& layer : *model) {
      a = layer.forward(a);
      if (a.dim() == 4 && a.size(2) * a.size(3) > 1) {
        EXPECT_TRUE(runs_channels_last(a)) << layer.ptr()->name();
        ++images;
      }
    }
    EXPECT_GE(images, 5);
    EXPECT_EQ(a.sizes(), (std::vector<int64_t>{4, 10}));
  }
}

} // namespace
