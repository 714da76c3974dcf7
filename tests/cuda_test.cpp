// CUDA paths, run by scripts/gpu-check.sh on the GPU machine; every test skips
// where libtorch has no CUDA or no GPU is visible (CI).
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <cstdlib>
#include <fstream>
#include <limits>

namespace {

using namespace mixtrain;
namespace nn = torch::nn;

#define SKIP_WITHOUT_CUDA() \
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA"

std::unique_ptr<Learner> cuda_learner(nn::Sequential net, int64_t n = 128) {
  auto ds = test::blobs(n, 3, 4);
  auto dls = data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)),
                               data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)));
  return std::make_unique<Learner>(Model(net), std::move(dls), cross_entropy(),
                                   LearnerOptions().progress(false).device(torch::kCUDA));
}

TEST(CudaTest, Fp16AutocastWithFusedScalerOpsFollowsTorchsScaleRule) {
  SKIP_WITHOUT_CUDA();
  auto learn = cuda_learner(nn::Sequential(nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 3)));
  learn->to_fp16(amp::GradScalerOptions().init_scale(65536).growth_interval(2));
  learn->fit(1, 1e-2, {std::make_shared<test::InjectOverflow>(std::set<int64_t>{0, 1, 4})});
  auto pc = learn->precision_cb();
  ASSERT_FALSE(pc->emulated());  // real fp16 on the GPU
  const std::vector<double> expected{65536, 32768, 16384, 16384, 32768, 16384, 16384, 32768};
  EXPECT_EQ(test::recorded_scales(*learn), expected);
  EXPECT_EQ(learn->recorder().skipped_steps(), 3);
  // For the script's comparison with torch's own Python GradScaler on the same pattern.
  if (const char* path = std::getenv("MIXTRAIN_SCALE_SEQUENCE_OUT")) {
    std::ofstream f(path);
    for (double s : test::recorded_scales(*learn)) f << s << "\n";
  }
  EXPECT_TRUE(learn->model().module().parameters()[0].is_cuda());
}

TEST(CudaTest, Bf16TrainsOrIsReportedUnsupported) {
  SKIP_WITHOUT_CUDA();
  auto learn = cuda_learner(nn::Sequential(nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 3)), 512);
  learn->to_bf16();
  if (!compat::cuda_bf16_supported()) {
    EXPECT_THROW_WITH(learn->fit(1, 1e-2), "Unsupported GPU for bfloat16");
    return;
  }
  learn->fit(3, 1e-2);
  const auto& steps = learn->recorder().steps();
  EXPECT_LT(steps.back().smooth_loss, steps.front().loss);
}

TEST(CudaTest, Fp16MasterWeightsTrainWithFp32Masters) {
  SKIP_WITHOUT_CUDA();
  auto learn = cuda_learner(nn::Sequential(nn::Linear(4, 16), nn::BatchNorm1d(16), nn::ReLU(), nn::Linear(16, 3)), 512);
  learn->to_half(amp::MasterWeightsOptions().dtype(torch::kHalf));
  learn->fit(3, 1e-2);
  auto mw = learn->get_cb<amp::MasterWeights>();
  ASSERT_TRUE(mw);
  EXPECT_EQ(learn->model().module().parameters()[0].scalar_type(), torch::kHalf);
  EXPECT_EQ(mw->masters()[0].scalar_type(), torch::kFloat);
  const auto& steps = learn->recorder().steps();
  EXPECT_LT(steps.back().smooth_loss, steps.front().loss);
}

TEST(CudaTest, DataParallelOneRankOnCudaTensors) {
  SKIP_WITHOUT_CUDA();
  // Gloo at world size 1 (NCCL is not wired in: see the README).
  static int port = 33000 + static_cast<int>(::getpid() % 500);
  auto group = distributed::ProcessGroup::connect({0, 1, 0, "127.0.0.1", port++}, std::chrono::seconds(30));
  auto learn = cuda_learner(nn::Sequential(nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 3)), 256);
  learn->add_cb(std::make_shared<callbacks::DataParallel>(group));
  learn->to_fp16();
  learn->fit(2, 1e-2);
  const auto& steps = learn->recorder().steps();
  EXPECT_LT(steps.back().smooth_loss, steps.front().loss);
}

TEST(CudaTest, Bf16GradientsAreCheckedAndUnscaledOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  // ATen's fused check takes no bf16: bf16-master's bf16 gradients go another way, still without a host read.
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  torch::Tensor finite = torch::full({5}, 4.0, opts.dtype(torch::kBFloat16)), f32 = torch::full({3}, 2.0, opts);
  torch::Tensor found = torch::zeros({1}, opts);
  amp::non_finite_check_and_unscale_({finite, f32}, found, torch::full({1}, 0.5, opts));
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(finite.cpu(), torch::full({5}, 2.0, torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(f32.cpu(), torch::full({3}, 1.0)));
  torch::Tensor inf = torch::tensor({1.0f, std::numeric_limits<float>::infinity()}, opts).to(torch::kBFloat16);
  amp::non_finite_check_and_unscale_({inf}, found, torch::ones({1}, opts));
  EXPECT_EQ(found.item<float>(), 1.0f);
}

TEST(CudaTest, ALoaderOverADatasetOnTheGpuShufflesThere) {
  SKIP_WITHOUT_CUDA();
  // The order is drawn on the CPU; the batches are gathered on the dataset's device.
  auto ds = test::blobs(64, 3, 4);
  ds.x = ds.x.to(torch::kCUDA);
  ds.y = ds.y.to(torch::kCUDA);
  data::DataLoader loader(ds, data::DataLoaderOptions().batch_size(16).shuffle(true).seed(3));
  int64_t batches = 0;
  for (const auto& b : loader) {
    EXPECT_TRUE(b.x.is_cuda());
    EXPECT_EQ(b.x.size(0), 16);
    ++batches;
  }
  EXPECT_EQ(batches, 4);
}

// fp32 islands under real CUDA autocast: an island's matmul skips autocast (fp32),
// the one outside runs in fp16, and a Learner with an island trains.
TEST(CudaTest, Fp32IslandsSkipCudaAutocast) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA";
  const torch::Tensor x = torch::randn({64, 64}, torch::kCUDA);
  torch::Tensor in_island, outside;
  {
    amp::autocast guard(torch::kCUDA, torch::kHalf);
    amp::Fp32Islands islands({"attn"});
    {
      const ModuleScope attn("attn");
      in_island = torch::matmul(x, x.t());
    }
    outside = torch::matmul(x, x.t());
  }
  EXPECT_EQ(in_island.scalar_type(), torch::kFloat);
  EXPECT_EQ(outside.scalar_type(), torch::kHalf);
  Learner learn(torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3)),
                data::DataLoaders::from_split({mixtrain::test::blobs(256), mixtrain::test::blobs(64, 3, 4, 2)}, 32, 1),
                cross_entropy(), LearnerOptions().progress(false).device(torch::kCUDA));
  learn.set_precision(Precision::kFp16, PrecisionOptions().keep_fp32({"2"}));
  learn.fit(2, 1e-2);
  EXPECT_TRUE(std::isfinite(learn.recorder().values().back().valid_loss));
}

} // namespace

