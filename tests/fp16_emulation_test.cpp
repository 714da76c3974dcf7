// fp16 emulation on CPU: forward overflow, half rounding of listed ops for any
// module, gradient rounding and underflow, and its use by to_fp16().
#include "test_util.h"

#include <mixtrain/amp/fp16_emulation.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;
using amp::Fp16Emulation;

torch::Tensor half_round(const torch::Tensor& t) { return t.to(torch::kHalf).to(torch::kFloat); }

/// A user module calling its children through holder members.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() : fc1(register_module("fc1", torch::nn::Linear(4, 8))), fc2(register_module("fc2", torch::nn::Linear(8, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TwoLayer);

class Fp16EmulationTest : public test::SeededTest {};

TEST_F(Fp16EmulationTest, ActivationsAbove65504OverflowOnlyUnderEmulation) {
  torch::nn::Linear big(4, 4);
  {
    torch::NoGradGuard g;
    big->weight.fill_(1000.0);
    big->bias.zero_();
  }
  const torch::Tensor x = torch::full({2, 4}, 100.0);  // each output is 4e5 > 65504
  const torch::Tensor fp32 = big->forward(x);
  EXPECT_TRUE(torch::isfinite(fp32).all().item<bool>());
  EXPECT_FALSE(Fp16Emulation::is_enabled());
  torch::Tensor fp16;
  {
    Fp16Emulation on;
    EXPECT_TRUE(Fp16Emulation::is_enabled());
    fp16 = big->forward(x);
  }
  EXPECT_FALSE(Fp16Emulation::is_enabled());
  EXPECT_TRUE(torch::isinf(fp16).all().item<bool>());
  // 60000 is representable: no overflow just below the limit.
  Fp16Emulation on;
  EXPECT_TRUE(torch::isfinite(big->forward(torch::full({1, 4}, 15.0))).all().item<bool>());
}

TEST_F(Fp16EmulationTest, UserModuleMatchesManualHalfRounding) {
  TwoLayer net;
  const torch::Tensor x = torch::randn({5, 4}) * 3;
  torch::Tensor emulated;
  {
    Fp16Emulation on;
    emulated = net->forward(x);
  }
  // Listed ops (linear) see half-rounded inputs and weights and give half-rounded outputs;
  // relu runs in fp32 on what it gets.
  namespace F = torch::nn::functional;
  torch::NoGradGuard no_grad;
  const torch::Tensor h = half_round(F::linear(half_round(x), half_round(net->fc1->weight), half_round(net->fc1->bias)));
  const torch::Tensor expected =
      half_round(F::linear(half_round(torch::relu(h)), half_round(net->fc2->weight), half_round(net->fc2->bias)));
  EXPECT_TRUE(torch::equal(emulated, expected));
  EXPECT_FALSE(torch::equal(emulated, net->forward(x)));  // fp32 differs: rounding really happened
}

TEST_F(Fp16EmulationTest, GradientsRoundThroughHalfAndUnderflowWithoutScaling) {
  torch::nn::Linear lin(4, 2);
  const torch::Tensor x = torch::randn({3, 4});
  auto weight_grad = [&](double loss_scale, bool emulate) {
    lin->zero_grad();
    std::optional<Fp16Emulation> on;
    if (emulate) on.emplace();
    torch::Tensor loss = lin->forward(x).sum() * 1e-9 * loss_scale;  // true grads ~1e-9 < fp16's 6e-8
    on.reset();
    loss.backward();
    return lin->weight.grad().clone() / loss_scale;
  };
  const torch::Tensor fp32 = weight_grad(1, false), emulated = weight_grad(1, true), scaled = weight_grad(65536, true);
  EXPECT_GT(fp32.abs().max().item<double>(), 0.0);
  EXPECT_EQ(emulated.abs().max().item<double>(), 0.0);  // flushed to zero, as on a GPU
  EXPECT_TRUE(torch::allclose(scaled, fp32, 1e-2, 1e-12));  // loss scaling rescues them
  // Every emulated gradient is a half value (before unscaling).
  lin->zero_grad();
  torch::Tensor loss;
  {
    Fp16Emulation on;
    loss = lin->forward(x).pow(2).sum();
  }
  loss.backward();
  EXPECT_TRUE(torch::equal(lin->weight.grad(), half_round(lin->weight.grad())));
}

TEST_F(Fp16EmulationTest, UnlistedOpsStayFp32DocumentedLimit) {
  Fp16Emulation on;
  const torch::Tensor big = torch::exp(torch::full({1}, 12.0));  // 162754.8 > 65504, but exp is not listed
  EXPECT_TRUE(torch::isfinite(big).all().item<bool>());
  EXPECT_FALSE(torch::equal(big, half_round(big)));
}

TEST_F(Fp16EmulationTest, ToFp16OnCpuEmulatesSkipsAndLearns) {
  auto dls = data::DataLoaders::from_split({test::blobs(512, 3, 4, 31), test::blobs(256, 3, 4, 32)}, 32, 1);
  Learner learn(TwoLayer(), dls, cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
  // Start far too high: the scale must back off until gradients fit in half.
  learn.to_fp16(amp::GradScalerOptions().init_scale(std::pow(2.0, 24)));
  learn.fit_one_cycle(3, 1e-2);
  auto pc = learn.precision_cb();
  EXPECT_TRUE(pc->emulated());
  EXPECT_GT(learn.recorder().skipped_steps(), 0) << "scale " << pc->loss_scale();
  EXPECT_LT(pc->loss_scale(), std::pow(2.0, 24));
  EXPECT_TRUE(learn.recorder().steps().front().skipped);
  EXPECT_GT(learn.recorder().values().back().metrics[0], 0.9);

  Learner strict(TwoLayer(), dls, cross_entropy(), LearnerOptions().progress(false));
  strict.to_fp16({}, /*allow_fp16_emulation=*/false);
  EXPECT_THROW_WITH(strict.fit(1), "fp16 emulation on CPU is forbidden");
}

} // namespace

namespace {

// ctest runs every test in its own process, so here nothing has used the
// dispatcher mode yet: linking the library must not have registered it.
TEST(Fp16EmulationRegistrationTest, TheDispatcherFallbackIsRegisteredOnlyWhenFirstNeeded) {
  auto& dispatcher = c10::Dispatcher::singleton();
  const auto key = c10::DispatchKey::TESTING_ONLY_GenericMode;
  if (dispatcher.hasBackendFallbackForDispatchKey(key))
    GTEST_SKIP() << "an earlier test in this process used the mode (run it alone, as ctest does)";
  { amp::Fp16Emulation on; }
  EXPECT_TRUE(dispatcher.hasBackendFallbackForDispatchKey(key));
}

} // namespace

namespace {

// CUDA autocast registers only the functional overloads: mm.out runs as it is and
// writes the caller's tensor.
TEST(Fp16EmulationOverloadTest, OutOverloadsWriteTheCallersTensorUnrounded) {
  torch::manual_seed(3);
  const torch::Tensor a = torch::randn({3, 4}), b = torch::randn({4, 5});
  torch::Tensor out = torch::full({3, 5}, -7.0);
  {
    amp::Fp16Emulation on;
    torch::mm_out(out, a, b);
  }
  EXPECT_TRUE(torch::equal(out, torch::mm(a, b)));
}

// Autocast runs cdist / tensordot in fp32 (or the widest input type) and excludes
// itself for their inner calls, so their inner matmul is not rounded to half.
TEST(Fp16EmulationOverloadTest, Fp32AndPromoteListOpsRunTheirInnerCallsUnrounded) {
  torch::manual_seed(4);
  const torch::Tensor a = torch::randn({30, 8}), b = torch::randn({40, 8});  // > 25 rows: cdist uses a matmul
  const torch::Tensor x = torch::randn({6, 7}), y = torch::randn({7, 3});
  torch::Tensor d, t;
  {
    amp::Fp16Emulation on;
    d = torch::cdist(a, b);
    t = torch::tensordot(x, y, {1}, {0});
  }
  EXPECT_TRUE(torch::equal(d, torch::cdist(a, b)));
  EXPECT_TRUE(torch::equal(t, torch::tensordot(x, y, {1}, {0})));
}

} // namespace
