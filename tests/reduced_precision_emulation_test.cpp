// fp16 emulation on CPU: forward overflow, half rounding of listed ops for any
// module, gradient rounding and underflow, and its use by to_fp16().
#include "test_util.h"

#include <mixtrain/amp/reduced_precision_emulation.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;
using amp::ReducedPrecisionEmulation;

torch::Tensor half_round(const torch::Tensor& t) { return t.to(torch::kHalf).to(torch::kFloat); }

/// A user module calling its children through holder members.
struct HolderCallingNetImpl : torch::nn::Module {
  HolderCallingNetImpl() : fc1(register_module("fc1", torch::nn::Linear(4, 8))), fc2(register_module("fc2", torch::nn::Linear(8, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(HolderCallingNet);

class ReducedPrecisionEmulationTest : public test::SeededTest {};

TEST_F(ReducedPrecisionEmulationTest, ActivationsAbove65504OverflowOnlyUnderEmulation) {
  torch::nn::Linear big(4, 4);
  {
    torch::NoGradGuard g;
    big->weight.fill_(1000.0);
    big->bias.zero_();
  }
  const torch::Tensor x = torch::full({2, 4}, 100.0);  // each output is 4e5 > 65504
  const torch::Tensor fp32 = big->forward(x);
  EXPECT_TRUE(torch::isfinite(fp32).all().item<bool>());
  EXPECT_FALSE(ReducedPrecisionEmulation::is_enabled());
  torch::Tensor fp16;
  {
    ReducedPrecisionEmulation on;
    EXPECT_TRUE(ReducedPrecisionEmulation::is_enabled());
    fp16 = big->forward(x);
  }
  EXPECT_FALSE(ReducedPrecisionEmulation::is_enabled());
  EXPECT_TRUE(torch::isinf(fp16).all().item<bool>());
  // 60000 is representable: no overflow just below the limit.
  ReducedPrecisionEmulation on;
  EXPECT_TRUE(torch::isfinite(big->forward(torch::full({1, 4}, 15.0))).all().item<bool>());
}

TEST_F(ReducedPrecisionEmulationTest, UserModuleMatchesManualHalfRounding) {
  HolderCallingNet net;
  const torch::Tensor x = torch::randn({5, 4}) * 3;
  torch::Tensor emulated;
  {
    ReducedPrecisionEmulation on;
    emulated = net->forward(x);
  }
  // Listed ops (linear) see half-rounded inputs and weights and give half-rounded outputs;
  // relu of an fp16 result is an fp16 result (it keeps the half values it gets).
  namespace F = torch::nn::functional;
  torch::NoGradGuard no_grad;
  const torch::Tensor h = half_round(F::linear(half_round(x), half_round(net->fc1->weight), half_round(net->fc1->bias)));
  const torch::Tensor expected =
      half_round(F::linear(half_round(torch::relu(h)), half_round(net->fc2->weight), half_round(net->fc2->bias)));
  EXPECT_TRUE(torch::equal(emulated, expected));
  EXPECT_FALSE(torch::equal(emulated, net->forward(x)));  // fp32 differs: rounding really happened
}

TEST_F(ReducedPrecisionEmulationTest, GradientsRoundThroughHalfAndUnderflowWithoutScaling) {
  torch::nn::Linear lin(4, 2);
  const torch::Tensor x = torch::randn({3, 4});
  auto weight_grad = [&](double loss_scale, bool emulate) {
    lin->zero_grad();
    std::optional<ReducedPrecisionEmulation> on;
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
    ReducedPrecisionEmulation on;
    loss = lin->forward(x).pow(2).sum();
  }
  loss.backward();
  EXPECT_TRUE(torch::equal(lin->weight.grad(), half_round(lin->weight.grad())));
}

TEST_F(ReducedPrecisionEmulationTest, Fp32ListOpsStayFp32EvenOnFp16Results) {
  ReducedPrecisionEmulation on;
  const torch::Tensor h = torch::nn::functional::linear(torch::full({1, 1}, 3.0), torch::full({1, 1}, 4.0));
  ASSERT_TRUE(amp::holds_reduced_result(h));
  const torch::Tensor big = torch::exp(h);  // e^12 = 162754.8 > 65504: exp is on autocast's fp32 list
  EXPECT_TRUE(torch::isfinite(big).all().item<bool>());
  EXPECT_FALSE(amp::holds_reduced_result(big));
  EXPECT_FALSE(torch::equal(big, half_round(big)));
}

TEST_F(ReducedPrecisionEmulationTest, ToFp16OnCpuEmulatesSkipsAndLearns) {
  auto dls = data::DataLoaders::from_split({test::blobs(512, 3, 4, 31), test::blobs(256, 3, 4, 32)}, 32, 1);
  Learner learn(HolderCallingNet(), dls, cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
  // Start far too high: the scale must back off until gradients fit in half.
  learn.to_fp16(amp::GradScalerOptions().init_scale(std::pow(2.0, 24)));
  learn.fit_one_cycle(3, 1e-2);
  auto pc = learn.precision_cb();
  EXPECT_TRUE(pc->emulated());
  EXPECT_GT(learn.recorder().skipped_steps(), 0) << "scale " << pc->loss_scale();
  EXPECT_LT(pc->loss_scale(), std::pow(2.0, 24));
  EXPECT_TRUE(learn.recorder().steps().front().skipped);
  EXPECT_GT(learn.recorder().values().back().metrics[0], 0.9);

  Learner strict(HolderCallingNet(), dls, cross_entropy(), LearnerOptions().progress(false));
  strict.to_fp16({}, /*allow_fp16_emulation=*/false);
  EXPECT_THROW_WITH(strict.fit(1), "fp16 emulation on CPU is forbidden");
}

} // namespace

namespace {

// ctest runs every test in its own process, so here nothing has used the
// dispatcher mode yet: linking the library must not have registered it.
TEST(ReducedPrecisionEmulationRegistrationTest, TheDispatcherFallbackIsRegisteredOnlyWhenFirstNeeded) {
  auto& dispatcher = c10::Dispatcher::singleton();
  const auto key = c10::DispatchKey::TESTING_ONLY_GenericMode;
  if (dispatcher.hasBackendFallbackForDispatchKey(key))
    GTEST_SKIP() << "an earlier test in this process used the mode (run it alone, as ctest does)";
  { amp::ReducedPrecisionEmulation on; }
  EXPECT_TRUE(dispatcher.hasBackendFallbackForDispatchKey(key));
}

} // namespace

namespace {

// CUDA autocast registers only the functional overloads: mm.out runs as it is and
// writes the caller's tensor.
TEST(ReducedPrecisionEmulationOverloadTest, OutOverloadsWriteTheCallersTensorUnrounded) {
  torch::manual_seed(3);
  const torch::Tensor a = torch::randn({3, 4}), b = torch::randn({4, 5});
  torch::Tensor out = torch::full({3, 5}, -7.0);
  {
    amp::ReducedPrecisionEmulation on;
    torch::mm_out(out, a, b);
  }
  EXPECT_TRUE(torch::equal(out, torch::mm(a, b)));
}

// Autocast runs cdist / tensordot in fp32 (or the widest input type) and excludes
// itself for their inner calls, so their inner matmul is not rounded to half.
TEST(ReducedPrecisionEmulationOverloadTest, Fp32AndPromoteListOpsRunTheirInnerCallsUnrounded) {
  torch::manual_seed(4);
  const torch::Tensor a = torch::randn({30, 8}), b = torch::randn({40, 8});  // > 25 rows: cdist uses a matmul
  const torch::Tensor x = torch::randn({6, 7}), y = torch::randn({7, 3});
  torch::Tensor d, t;
  {
    amp::ReducedPrecisionEmulation on;
    d = torch::cdist(a, b);
    t = torch::tensordot(x, y, {1}, {0});
  }
  EXPECT_TRUE(torch::equal(d, torch::cdist(a, b)));
  EXPECT_TRUE(torch::equal(t, torch::tensordot(x, y, {1}, {0})));
}

} // namespace

namespace {

// ---- The op-by-op rules (reduced_precision_emulation.h), against references written by hand.

using torch::indexing::Slice;
namespace F = torch::nn::functional;

class FaithfulEmulationTest : public test::SeededTest {};

TEST_F(FaithfulEmulationTest, AChainOfOpsRoundsWhereAGpuHasHalfTensors) {
  torch::nn::Linear lin(8, 8);
  const torch::Tensor x = torch::randn({4, 8}) * 2;
  torch::Tensor h, r, s, a, p, q;
  {
    torch::NoGradGuard no_grad;
    ReducedPrecisionEmulation on;
    h = lin->forward(x);   // fp16 list
    r = torch::relu(h);    // fp16 in, fp16 out
    s = r * 3.7;           // a Python scalar keeps fp16
    a = s + h;             // residual add of two fp16 results: fp16
    p = torch::softmax(a, -1);  // fp32 list: fp32 out
    q = a * p;             // half * float promotes to float: not rounded
    EXPECT_TRUE(amp::holds_reduced_result(a));  // asked inside: after the pass every tensor is plain fp32
    EXPECT_FALSE(amp::holds_reduced_result(p));
    EXPECT_FALSE(amp::holds_reduced_result(q));
  }
  EXPECT_FALSE(amp::holds_reduced_result(a));
  torch::NoGradGuard no_grad;
  const torch::Tensor H = half_round(F::linear(half_round(x), half_round(lin->weight), half_round(lin->bias)));
  const torch::Tensor R = torch::relu(H), S = half_round(R * 3.7), A = half_round(S + H);
  const torch::Tensor P = torch::softmax(A, -1), Q = A * P;
  for (const auto& [got, want] : {std::pair{h, H}, {r, R}, {s, S}, {a, A}, {p, P}, {q, Q}})
    EXPECT_TRUE(torch::equal(got, want));
  EXPECT_FALSE(torch::equal(Q, half_round(Q)));  // the rules matter: rounding q would change it
  EXPECT_FALSE(torch::equal(S + H, A));           // and so does rounding the residual add
}

TEST_F(FaithfulEmulationTest, LayerNormAfterAnFp16LinearAndACatWithFp32StayFp32) {
  torch::nn::Linear lin(16, 16);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({16}));
  const torch::Tensor x = torch::randn({4, 16}), f = torch::randn({4, 3}) / 3;
  torch::Tensor h, n, c, c16;
  {
    torch::NoGradGuard no_grad;
    ReducedPrecisionEmulation on;
    h = lin->forward(x);
    n = ln->forward(h);
    c = torch::cat({h, f}, 1);
    c16 = torch::cat({h, h * 0.3}, 1);
    EXPECT_FALSE(amp::holds_reduced_result(n));
    EXPECT_FALSE(amp::holds_reduced_result(c));    // fp16 with fp32: fp32
    EXPECT_TRUE(amp::holds_reduced_result(c16));   // fp16 with fp16: fp16
  }
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(n, ln->forward(h)));  // fp32 on the half values, not rounded
  EXPECT_FALSE(torch::equal(n, half_round(n)));
  EXPECT_TRUE(torch::equal(c, torch::cat({h, f}, 1)));  // f is not rounded
  EXPECT_FALSE(torch::equal(f, half_round(f)));
}

TEST_F(FaithfulEmulationTest, AnElementwiseChainsGradientIsRoundedAfterEachFp16OpsBackward) {
  const torch::Tensor x = (torch::randn({6, 5}) * 4).requires_grad_();
  const torch::Tensor cst = torch::randn({6, 5}) * 1e-3;
  torch::Tensor h, y, z, w, v;
  {
    ReducedPrecisionEmulation on;
    h = x.to(torch::kHalf);  // under emulation: fp32 storage holding an fp16 result
    y = h * 1.7;
    z = torch::relu(y);
    w = z * h;
    v = w + y;
    EXPECT_EQ(h.scalar_type(), torch::kFloat);
    EXPECT_TRUE(amp::holds_reduced_result(v));
  }
  (v * cst).sum().backward();
  // By hand: autograd's backward of each op, in fp32, with the gradient of every
  // fp16 tensor rounded to half (the tensors' own values are the emulated ones).
  torch::NoGradGuard no_grad;
  const torch::Tensor g_v = half_round(cst);                          // v * cst: float, v's gradient is half
  const torch::Tensor g_w = half_round(g_v);                          // add passes it on
  const torch::Tensor g_y = half_round(g_v + (g_w * h) * (y > 0));    // from v, and through relu from w
  const torch::Tensor g_h = half_round(g_w * z + g_y * 1.7);          // from w and from y
  EXPECT_TRUE(torch::equal(x.grad(), half_round(g_h)));
  EXPECT_FALSE(torch::equal(g_w * z + g_y * 1.7, g_h));  // rounding happened
}

/// fc's outputs are about 40000 each (below 65504); their residual sum is not.
struct ResidualSumImpl : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 4))}, head{register_module("head", torch::nn::Linear(4, 3))};
  ResidualSumImpl() {
    torch::NoGradGuard no_grad;
    fc->weight.fill_(10000.0);
    fc->bias.zero_();
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = fc(x);
    return head(h + h * 0.75) * 1e-5;
  }
};
TORCH_MODULE(ResidualSum);

TEST_F(FaithfulEmulationTest, AResidualAddPast65504MakesTheLossNonFiniteAndTheStepSkipped) {
  data::Dataset d{torch::ones({32, 4}), torch::zeros({32}, torch::kLong)};
  auto run = [&](bool fp16) {
    torch::manual_seed(0);
    Learner learn(ResidualSum(), data::DataLoaders::from_split({d, d}, 8, 0), cross_entropy(), LearnerOptions().progress(false));
    if (fp16) learn.to_fp16(amp::GradScalerOptions().init_scale(1));
    learn.fit(1, 1e-9);
    return learn.recorder().steps().front();
  };
  const auto fp32 = run(false), fp16 = run(true);
  EXPECT_TRUE(std::isfinite(fp32.loss));
  EXPECT_FALSE(fp32.skipped);
  EXPECT_FALSE(std::isfinite(fp16.loss));  // 40000 + 30000 = 70000 -> inf in fp16
  EXPECT_TRUE(fp16.skipped);
}

TEST(RoundingKernelTest, HalfAndBfloat16RoundingIsBitwiseTorchsConversion) {
  torch::manual_seed(5);
  torch::Tensor x = torch::cat({torch::randn({100003}) * 3e4, torch::randn({1000}) * 1e-6, torch::randn({1000}) * 1e-9,
                                torch::tensor({65504.f, 65519.f, 65520.f, 1e9f, -1e9f, 6e-8f, 2.9e-8f, 0.f, -0.f,
                                               INFINITY, -INFINITY, NAN, 3.3895e38f})});
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::Tensor out = torch::empty_like(x);
    amp::round_floats(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(), dtype);
    const torch::Tensor want = x.to(dtype).to(torch::kFloat);
    EXPECT_TRUE(torch::equal(out.isnan(), want.isnan()));
    EXPECT_TRUE(torch::equal(torch::nan_to_num(out, 0, 1, -1).view(torch::kInt), torch::nan_to_num(want, 0, 1, -1).view(torch::kInt)));
  }
}

TEST_F(FaithfulEmulationTest, Bf16EmulationRoundsThroughBfloat16AndIsUsedWithoutBf16Units) {
  torch::nn::Linear lin(8, 8);
  const torch::Tensor x = torch::randn({4, 8});
  torch::Tensor h, s;
  {
    torch::NoGradGuard no_grad;
    ReducedPrecisionEmulation on(torch::kBFloat16);
    EXPECT_EQ(ReducedPrecisionEmulation::dtype(), torch::kBFloat16);
    h = lin->forward(x);
    s = h * 1.1;
  }
  auto bf = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor H = bf(F::linear(bf(x), bf(lin->weight), bf(lin->bias)));
    EXPECT_TRUE(torch::equal(h, H));
    EXPECT_TRUE(torch::equal(s, bf(H * 1.1)));
  }
  // A CPU without bf16 instructions (forced here) trains bf16 emulated, and says so.
  ::setenv("MIXTRAIN_CPU_BF16", "0", 1);
  auto dls = data::DataLoaders::from_split({test::blobs(512, 3, 4, 31), test::blobs(256, 3, 4, 32)}, 32, 1);
  auto accuracy_in = [&](bool bf16) {
    torch::manual_seed(0);
    Learner learn(HolderCallingNet(), dls, cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
    if (bf16) learn.to_bf16();
    learn.fit_one_cycle(3, 1e-2);
    if (bf16) EXPECT_TRUE(learn.precision_cb()->emulated());
    return learn.recorder().values().back().metrics[0];
  };
  const double fp32 = accuracy_in(false), bf16 = accuracy_in(true);
  ::unsetenv("MIXTRAIN_CPU_BF16");
  EXPECT_GT(bf16, 0.9);
  EXPECT_NEAR(bf16, fp32, 0.05);
}

} // namespace
