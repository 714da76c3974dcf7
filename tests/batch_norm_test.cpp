// models::BatchNorm2d: torch's BatchNorm2d to the bit, forward and backward, whichever way its
// forward goes. Each test runs torch's module and ours from the same state on the same batch and
// compares every output, gradient and buffer with torch::equal.
#include "test_util.h"

#include <mixtrain/mixtrain.h>
#include <mixtrain/models/batch_norm.h>

#include <cstdlib>
#include <vector>

namespace {

using namespace mixtrain;

struct Stepped {
  std::vector<torch::Tensor> values;  // output, input grad, weight grad, bias grad, buffers
};

/// Two training steps of `bn` on batches shaped `shape` (the second sees the first's running
/// statistics), then one in evaluation; everything they produce.
template <typename Module>
Stepped step(Module bn, std::vector<int64_t> shape, bool channels_last = false) {
  Stepped s;
  bn->train();
  for (int round = 0; round < 2; ++round) {
    torch::Tensor x = (torch::randn(shape) * 3 + 1.5);
    if (channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    x.requires_grad_(true);
    const torch::Tensor y = bn->forward(x);
    const torch::Tensor g = torch::randn(shape);
    y.backward(g);
    s.values.insert(s.values.end(), {y.detach(), x.grad()});
    for (const auto& p : bn->parameters()) {
      s.values.push_back(p.grad().clone());
      p.mutable_grad().zero_();
    }
  }
  for (const auto& b : bn->buffers()) s.values.push_back(b.clone());
  bn->eval();
  s.values.push_back(bn->forward(torch::randn(shape)).detach());
  return s;
}

void expect_same_bits(const Stepped& ours, const Stepped& theirs) {
  ASSERT_EQ(ours.values.size(), theirs.values.size());
  for (size_t i = 0; i < ours.values.size(); ++i)
    EXPECT_TRUE(torch::equal(ours.values[i], theirs.values[i]))
        << "value " << i << " differs by up to " << (ours.values[i] - theirs.values[i]).abs().max().item<double>();
}

class BatchNormTest : public test::SeededTest {
 protected:
  /// Ours and torch's module from the same options and batches.
  void compare(const torch::nn::BatchNormOptions& options, const std::vector<int64_t>& shape, bool fast,
               bool channels_last = false) {
    torch::manual_seed(7);
    models::BatchNorm2d ours(options);
    torch::nn::BatchNorm2d theirs(options);
    {
      const torch::NoGradGuard no_grad;
      if (options.affine()) {  // weights away from 1 and 0, so their arithmetic shows
        ours->weight.uniform_(0.5, 1.5);
        ours->bias.uniform_(-1, 1);
        theirs->weight.copy_(ours->weight);
        theirs->bias.copy_(ours->bias);
      }
    }
    torch::Tensor probe = torch::zeros(shape);
    if (channels_last) probe = probe.contiguous(torch::MemoryFormat::ChannelsLast);
    EXPECT_EQ(models::batch_norm_fast_path_applies(*ours, probe), fast);
    torch::manual_seed(11);
    const Stepped a = step(ours, shape, channels_last);
    torch::manual_seed(11);
    const Stepped b = step(theirs, shape, channels_last);
    expect_same_bits(a, b);
  }
};

TEST_F(BatchNormTest, TheFastForwardGivesTorchsBitsOnTheShapesItServes) {
  // The built-in CNN's two layers, rows that end off the vector width, channels that do not
  // fill a thread's block, one image, and a cumulative average (no momentum).
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "the fast path needs AVX2 and FMA; without them every forward is torch's (the test below)";
  for (const int threads : {1, 2}) {
    torch::set_num_threads(threads);
    compare(torch::nn::BatchNormOptions(16), {256, 16, 14, 14}, true);
    compare(torch::nn::BatchNormOptions(32), {64, 32, 7, 7}, true);
    compare(torch::nn::BatchNormOptions(11), {5, 11, 3, 5}, true);
    compare(torch::nn::BatchNormOptions(2), {1, 2, 1, 2}, true);
    compare(torch::nn::BatchNormOptions(8), {3, 8, 2, 3}, true);  // eight channels, rows shorter than a vector
    compare(torch::nn::BatchNormOptions(9).momentum(std::nullopt).eps(1e-3), {4, 9, 6, 6}, true);
  }
}

TEST_F(BatchNormTest, ASecondDerivativeAndNoGradForwardsAreTorchsToo) {
  // A gradient penalty differentiates the backward: torch's backward kernel is differentiable
  // from the saved statistics on, as after torch's own forward. Without autograd (no_grad), the
  // running statistics move as torch's do.
  const auto run = [](auto bn) {
    torch::manual_seed(3);
    bn->train();
    const torch::Tensor x = torch::randn({6, 9, 5, 7}, torch::requires_grad());
    const torch::Tensor y = bn->forward(x);
    const torch::Tensor g = torch::autograd::grad({(y * y).sum()}, {x}, {}, /*retain_graph=*/true,
                                                  /*create_graph=*/true)[0];
    (g * g).sum().backward();
    std::vector<torch::Tensor> out{y.detach(), g.detach(), x.grad(), bn->weight.grad(), bn->bias.grad()};
    {
      const torch::NoGradGuard no_grad;
      out.push_back(bn->forward(torch::randn({6, 9, 5, 7})));
    }
    for (const auto& b : bn->buffers()) out.push_back(b.clone());
    return out;
  };
  const auto ours = run(models::BatchNorm2d(9));
  const auto theirs = run(torch::nn::BatchNorm2d(9));
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(torch::equal(ours[i], theirs[i])) << "value " << i;
}

TEST_F(BatchNormTest, EverythingElseIsTorchsOwnForward) {
  compare(torch::nn::BatchNormOptions(4).affine(false), {8, 4, 5, 5}, false);
  compare(torch::nn::BatchNormOptions(4).track_running_stats(false), {8, 4, 5, 5}, false);
  compare(torch::nn::BatchNormOptions(8), {8, 8, 5, 5}, false, /*channels_last=*/true);
  compare(torch::nn::BatchNormOptions(1), {8, 1, 5, 5}, false);
  compare(torch::nn::BatchNormOptions(4), {8, 4, 1, 1}, false);
  models::BatchNorm2d bn(4);
  EXPECT_FALSE(models::batch_norm_fast_path_applies(*bn, torch::zeros({8, 4, 5, 5}, torch::kBFloat16)));
  EXPECT_FALSE(models::batch_norm_fast_path_applies(*bn, torch::zeros({8, 4, 5, 5}).transpose(2, 3)));
  const amp::autocast on_cpu(torch::kCPU, torch::kBFloat16);
  EXPECT_FALSE(models::batch_norm_fast_path_applies(*bn, torch::zeros({8, 4, 5, 5})));
}

TEST_F(BatchNormTest, TheBuiltInCnnAndResNetNormalizeWithIt) {
  // Every BatchNorm of the two built-in image models is ours: 2 in the CNN; in the ResNet, the
  // stem's, two a block and the two strided blocks' shortcuts.
  const auto count = [](const torch::nn::Module& model, int64_t& ours, int64_t& all) {
    for (const auto& m : model.modules(/*include_self=*/false)) {
      all += dynamic_cast<const torch::nn::BatchNorm2dImpl*>(m.get()) != nullptr;
      ours += dynamic_cast<const models::BatchNorm2dImpl*>(m.get()) != nullptr;
    }
  };
  int64_t ours = 0, all = 0;
  count(*models::simple_cnn(), ours, all);
  EXPECT_EQ(ours, 2);
  EXPECT_EQ(all, 2);
  ours = all = 0;
  count(*models::resnet(), ours, all);
  EXPECT_EQ(ours, 9);
  EXPECT_EQ(all, 9);
}

} // namespace
