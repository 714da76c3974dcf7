// fp32 islands: the module boundary decides (parameter-free ops inside a module
// run in fp32 too), against hand-written references in the emulation; master
// weights keep an island's parameters fp32; checkpoints restore islands; a name
// that matches nothing is named with the closest module paths.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <cmath>

namespace {

using namespace mixtrain;

torch::Tensor half_rounded(const torch::Tensor& t) { return t.to(torch::kHalf).to(torch::kFloat); }

TEST(Fp32IslandsTest, AParameterFreeOpInsideAnIslandRunsInFp32AndTheOpsAfterItSeeFp32) {
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({8, 8}) * 3 + 0.1234567;  // values that half cannot hold exactly
  const torch::Tensor ref_fp32 = torch::matmul(x, x.t());
  const torch::Tensor ref_half = half_rounded(torch::matmul(half_rounded(x), half_rounded(x).t()));
  ASSERT_FALSE(torch::equal(ref_fp32, ref_half));
  torch::Tensor in_island, outside, after;
  {
    amp::ReducedPrecisionEmulation emulation(torch::kHalf);
    amp::Fp32Islands islands({"encoder.*.attn"});
    {
      const ModuleScope layer("encoder.0");
      const ModuleScope attn("attn");
      EXPECT_EQ(current_module_path(), "encoder.0.attn");
      in_island = torch::matmul(x, x.t());  // no parameter: the boundary alone puts it in the island
      EXPECT_FALSE(amp::holds_reduced_result(in_island));
    }
    outside = torch::matmul(x, x.t());
    EXPECT_TRUE(amp::holds_reduced_result(outside));
    after = in_island + outside;  // fp32 + fp16 result: promotes to fp32
    EXPECT_FALSE(amp::holds_reduced_result(after));
  }
  EXPECT_TRUE(torch::equal(in_island, ref_fp32));
  EXPECT_TRUE(torch::equal(outside, ref_half));
  EXPECT_TRUE(torch::equal(after, ref_fp32 + ref_half));
}

// Real autocast (the CPU's bf16 here; CUDA's in cuda_test.cpp): our dispatcher key sits
// above the Autocast keys, so an island's op skips autocast and computes in fp32.
TEST(Fp32IslandsTest, UnderRealAutocastAnIslandsOpsSkipAutocast) {
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({8, 8}) + 0.1234567;
  const torch::Tensor ref_fp32 = torch::mm(x, x.t());
  torch::Tensor in_island, outside, after;
  {
    amp::autocast guard(torch::kCPU, torch::kBFloat16);
    amp::Fp32Islands islands({"attn"});
    {
      const ModuleScope attn("attn");
      in_island = torch::mm(x, x.t());
    }
    outside = torch::mm(x, x.t());
    after = in_island + outside;
  }
  EXPECT_EQ(in_island.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(in_island, ref_fp32));
  EXPECT_EQ(outside.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(after.scalar_type(), torch::kFloat);  // the usual promotion after the island
}

// The island's input is a bf16 activation (an op outside it ran under autocast): the
// island casts it to fp32 and computes there. The cast itself once came back to the
// island (our key was still on for it), which cast again, until the stack overflowed.
TEST(Fp32IslandsTest, UnderRealAutocastAnIslandFedABf16ActivationComputesInFp32) {
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({8, 8}) + 0.1234567;
  const torch::Tensor w = torch::randn({8, 8});
  torch::Tensor activation, in_island;
  {
    amp::autocast guard(torch::kCPU, torch::kBFloat16);
    amp::Fp32Islands islands({"ln"});
    activation = torch::mm(x, w);  // outside: bf16
    {
      const ModuleScope ln("ln");
      in_island = torch::layer_norm(activation, {8});
    }
  }
  ASSERT_EQ(activation.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(in_island.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(in_island, torch::layer_norm(activation.to(torch::kFloat), {8})));
}

// A hand-written loop's keep_fp32 (C++ modules open no scope: parameter ownership places the
// ops): fp16 autocast on the CPU, a projection whose outputs pass 65504, then a LayerNorm
// (which autocast runs in fp32). Without the island the forward overflows; with it the loss
// and every gradient are finite, and the guard's end gives autocast back.
struct OverflowingImpl : torch::nn::Module {
  OverflowingImpl()
      : proj(register_module("proj", torch::nn::Linear(20, 32))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})))),
        head(register_module("head", torch::nn::Linear(32, 3))) {
    torch::NoGradGuard no_grad;
    proj->weight.mul_(50000);
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(norm(proj(x))); }
  torch::nn::Linear proj;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
};
TORCH_MODULE(Overflowing);

TEST(Fp32IslandsTest, KeepFp32InAHandWrittenAutocastLoopKeepsTheOverflowingModuleFinite) {
  torch::manual_seed(0);
  Overflowing model;
  const torch::Tensor x = torch::randn({16, 20}), y = torch::randint(0, 3, {16});
  const auto step = [&] {
    model->zero_grad();
    torch::Tensor loss;
    {
      amp::autocast fp16(torch::kCPU, torch::kHalf);
      loss = torch::nn::functional::cross_entropy(model->forward(x).to(torch::kFloat), y);
    }
    loss.backward();
    bool finite = std::isfinite(loss.item<double>());
    for (const auto& p : model->parameters()) finite = finite && torch::isfinite(p.grad()).all().item<bool>();
    return finite;
  };
  EXPECT_FALSE(step());  // the projection's outputs overflow fp16
  {
    const auto islands = amp::keep_fp32(*model, {"proj"});
    EXPECT_TRUE(step());
  }
  EXPECT_FALSE(step());  // the guard is gone: autocast as before
  EXPECT_THROW_WITH(amp::keep_fp32(*model, {"porj"}), "closest: proj");
}

TEST(Fp32IslandsTest, PatternsMatchModulePathsAndBadNamesAreNamed) {
  EXPECT_TRUE(module_path_matches("encoder.layers.*.mlp", "encoder.layers.3.mlp"));
  EXPECT_TRUE(module_path_matches("encoder.layers.*.mlp", "encoder.layers.3.mlp.0"));
  EXPECT_FALSE(module_path_matches("encoder.layers.*.mlp", "encoder.layers.3"));
  EXPECT_FALSE(module_path_matches("conv", "conv_proj"));
  const std::vector<std::string> paths{"conv_proj", "layers", "layers.0", "layers.0.mlp", "head"};
  EXPECT_EQ(amp::check_islands({"conv_proj"}, paths), std::vector<std::string>{"conv_proj"});
  EXPECT_THROW_WITH(amp::check_islands({"conv_prj"}, paths), "matches no module of the model (closest: conv_proj");
  EXPECT_THROW_WITH(amp::check_islands({""}, paths), "an empty module name");
  EXPECT_THROW_WITH(amp::check_islands({"*"}, paths), "matches every module of the model");
}

/// Linear(4, 8) -> ReLU -> Linear(8, 3): a Sequential runs its layers in scopes 0, 1, 2.
Learner blob_learner() {
  torch::manual_seed(3);
  return Learner(torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3)),
                 data::DataLoaders::from_split({test::blobs(128), test::blobs(64, 3, 4, 2)}, 32, 1), cross_entropy(),
                 LearnerOptions().progress(false));
}

TEST(Fp32IslandsTest, MasterWeightsKeepAnIslandsParametersFp32AndCheckpointsKeepTheIslands) {
  Learner learn = blob_learner();
  learn.set_precision(Precision::kBf16Master, PrecisionOptions().keep_fp32({"2"}));
  const auto params = learn.model().module().named_parameters();
  EXPECT_EQ(params["0.weight"].scalar_type(), torch::kBFloat16);
  EXPECT_EQ(params["2.weight"].scalar_type(), torch::kFloat);
  EXPECT_EQ(params["2.bias"].scalar_type(), torch::kFloat);
  learn.fit(1, 1e-2);
  EXPECT_TRUE(std::isfinite(learn.recorder().values().back().valid_loss));
  EXPECT_THROW_WITH(learn.set_precision(Precision::kFp16, PrecisionOptions().keep_fp32({"3"})),
                    "keep_fp32({\"3\"}) matches no module of the model (closest: ");

  // fp16: the islands are part of the mode, and a checkpoint restores them.
  Learner a = blob_learner();
  a.set_precision(Precision::kFp16, PrecisionOptions().keep_fp32({"0"}));
  a.fit(1, 1e-2);
  const std::string path = test::scratch_dir("islands_ckpt") + "/ckpt.pt";
  a.save(path);
  Learner b = blob_learner();
  b.set_precision(Precision::kFp16);
  b.load(path);
  EXPECT_EQ(b.get_cb<amp::MixedPrecision>()->keep_fp32(), std::vector<std::string>{"0"});
}

} // namespace

// keep_fp32 on a model stored in bf16 with no autocast (a Hugging Face model loaded in
// bfloat16, trained in a hand-written loop): the islands' parameters and buffers are fp32
// tensors while the guard lives, an island's op computes in fp32 on its input cast up and
// hands back bf16, and the rest of the model stays bf16. Checked bitwise against the same
// model written out by hand with the casts, forward and backward; the guard's end gives
// every tensor its dtype back.
struct Bf16StoredImpl : torch::nn::Module {
  Bf16StoredImpl()
      : fc(register_module("fc", torch::nn::Linear(8, 16))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})))),
        bn(register_module("bn", torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(16).affine(false)))),
        head(register_module("head", torch::nn::Linear(16, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(bn(norm(fc(x)))); }
  torch::nn::Linear fc;
  torch::nn::LayerNorm norm;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear head;
};
TORCH_MODULE(Bf16Stored);

TEST(Fp32IslandsTest, KeepFp32OnABf16StoredModelComputesTheIslandsInFp32AndHandsBackBf16) {
  torch::manual_seed(0);
  Bf16Stored model;
  {
    torch::NoGradGuard no_grad;
    model->norm->weight.uniform_(0.5, 1.5);  // gains and biases with more bits than bf16 holds
    model->norm->bias.uniform_(-0.1, 0.1);
  }
  const torch::Tensor norm_w = model->norm->weight.detach().clone(), norm_b = model->norm->bias.detach().clone();
  model->to(torch::kBFloat16);
  const torch::Tensor x = torch::randn({12, 8}).to(torch::kBFloat16);
  {
    torch::NoGradGuard no_grad;  // the fp32 values the islands will hold (bf16 storage rounded them)
    model->norm->weight.set_data(norm_w.to(torch::kBFloat16));
    model->norm->bias.set_data(norm_b.to(torch::kBFloat16));
  }

  // The reference, by hand: the same bf16 weights, the islands' ops on fp32 inputs, bf16 out.
  auto leaf = [](const torch::Tensor& t, torch::ScalarType dtype) { return t.detach().to(dtype).clone().requires_grad_(true); };
  const torch::Tensor fc_w = leaf(model->fc->weight, torch::kBFloat16), fc_b = leaf(model->fc->bias, torch::kBFloat16);
  const torch::Tensor ln_w = leaf(model->norm->weight, torch::kFloat), ln_b = leaf(model->norm->bias, torch::kFloat);
  const torch::Tensor head_w = leaf(model->head->weight, torch::kBFloat16), head_b = leaf(model->head->bias, torch::kBFloat16);
  torch::Tensor mean = model->bn->running_mean.detach().to(torch::kFloat), var = model->bn->running_var.detach().to(torch::kFloat);
  namespace F = torch::nn::functional;
  torch::Tensor h = F::linear(x, fc_w, fc_b);
  h = F::layer_norm(h.to(torch::kFloat), F::LayerNormFuncOptions({16}).weight(ln_w).bias(ln_b)).to(torch::kBFloat16);
  h = F::batch_norm(h.to(torch::kFloat), mean, var, F::BatchNormFuncOptions().training(true)).to(torch::kBFloat16);
  const torch::Tensor expected = F::linear(h, head_w, head_b);
  expected.to(torch::kFloat).square().mean().backward();

  {
    const auto islands = amp::keep_fp32(*model, {"norm", "bn"});
    EXPECT_EQ(model->norm->weight.scalar_type(), torch::kFloat);
    EXPECT_EQ(model->bn->running_var.scalar_type(), torch::kFloat);
    EXPECT_EQ(model->fc->weight.scalar_type(), torch::kBFloat16);
    const torch::Tensor out = model->forward(x);
    ASSERT_EQ(out.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(out, expected));
    EXPECT_TRUE(torch::equal(model->bn->running_mean, mean));  // the island's statistics are fp32 too
    out.to(torch::kFloat).square().mean().backward();
    ASSERT_EQ(model->norm->weight.grad().scalar_type(), torch::kFloat);
    ASSERT_EQ(model->fc->weight.grad().scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(model->norm->weight.grad(), ln_w.grad()));
    EXPECT_TRUE(torch::equal(model->norm->bias.grad(), ln_b.grad()));
    EXPECT_TRUE(torch::equal(model->fc->weight.grad(), fc_w.grad()));
    EXPECT_TRUE(torch::equal(model->head->weight.grad(), head_w.grad()));

    // An optimizer made inside steps both dtypes: a small update survives in the island's
    // fp32 gains, where bf16 storage would round most of it away.
    optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0));
    const torch::Tensor before = model->norm->weight.detach().clone();
    opt.step();
    EXPECT_EQ(model->norm->weight.scalar_type(), torch::kFloat);
    EXPECT_GT((model->norm->weight - before).abs().min().item<float>(), 0.f);
    EXPECT_EQ(model->fc->weight.scalar_type(), torch::kBFloat16);
  }
  // Released: every tensor has its dtype back, gradients included.
  EXPECT_EQ(model->norm->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->norm->weight.grad().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->bn->running_mean.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->forward(x).scalar_type(), torch::kBFloat16);  // the plain bf16 model runs again
}

// An fp32 model under no autocast is left as it was: keep_fp32 converts nothing, and its
// results are fp32.
TEST(Fp32IslandsTest, KeepFp32OnAnFp32ModelConvertsNothing) {
  torch::manual_seed(0);
  Bf16Stored model;
  const torch::Tensor x = torch::randn({12, 8});
  model->eval();
  const torch::Tensor plain = model->forward(x);
  const auto islands = amp::keep_fp32(*model, {"norm"});
  EXPECT_EQ(model->norm->weight.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(model->forward(x), plain));
}
