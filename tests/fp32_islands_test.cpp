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
