// End-to-end: a Learner fits, its loss falls and accuracy rises; determinism;
// user-defined modules; validate / get_preds; metrics; the Fashion-MNIST CNN.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;

/// A user-defined module calling its children through holder members.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() : fc1(register_module("fc1", torch::nn::Linear(4, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TwoLayer);

data::DataLoaders blob_loaders(uint64_t seed = 3) {
  auto train = test::blobs(512, 3, 4, 11), valid = test::blobs(256, 3, 4, 12);
  return data::DataLoaders::from_split({train, valid}, 32, seed);
}

class LearnerTest : public test::SeededTest {};

TEST_F(LearnerTest, FitLowersLossAndRaisesAccuracy) {
  Learner learn(TwoLayer(), blob_loaders(), cross_entropy(), LearnerOptions().progress(false).metrics({accuracy(), error_rate()}));
  const double acc_before = learn.validate()[1];
  learn.fit_one_cycle(3, 1e-2);
  const auto& rec = learn.recorder();
  ASSERT_EQ(rec.values().size(), 3u);
  ASSERT_EQ(rec.steps().size(), 3u * 16);  // 512 / 32, drop_last
  EXPECT_LT(rec.values().back().train_loss, 0.5 * rec.steps().front().loss);
  EXPECT_LT(rec.values().back().valid_loss, rec.values().front().valid_loss);
  const double acc = rec.values().back().metrics[0];
  EXPECT_GT(acc, 0.9);
  EXPECT_GT(acc, acc_before + 0.2);
  EXPECT_NEAR(rec.values().back().metrics[1], 1 - acc, 1e-9);
  EXPECT_EQ(rec.metric_names(), (std::vector<std::string>{"accuracy", "error_rate"}));
  // The history survives fit and a later validate does not add an epoch row.
  learn.validate();
  EXPECT_EQ(rec.values().size(), 3u);
}

TEST_F(LearnerTest, SameSeedGivesBitwiseIdenticalWeights) {
  auto train_once = [] {
    torch::manual_seed(5);
    Learner learn(TwoLayer(), blob_loaders(9), cross_entropy(), LearnerOptions().progress(false));
    learn.fit_one_cycle(2, 1e-2);
    std::vector<torch::Tensor> params;
    for (auto& p : learn.model().module().parameters()) params.push_back(p.detach().clone());
    return std::make_pair(params, learn.recorder().steps().back().loss);
  };
  auto a = train_once(), b = train_once();
  ASSERT_EQ(a.first.size(), b.first.size());
  for (size_t i = 0; i < a.first.size(); ++i) EXPECT_TRUE(torch::equal(a.first[i], b.first[i])) << i;
  EXPECT_EQ(a.second, b.second);
}

TEST_F(LearnerTest, GetPredsAndValidate) {
  Learner learn(torch::nn::Linear(4, 3), blob_loaders(), cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
  learn.fit(1, 1e-2);
  auto [preds, targets] = learn.get_preds();
  EXPECT_EQ(preds.sizes(), (std::vector<int64_t>{256, 3}));
  EXPECT_TRUE(torch::equal(targets, learn.dls().valid.dataset().y));
  const auto v = learn.validate();
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NEAR(v[0], torch::nn::functional::cross_entropy(preds, targets).item<double>(), 1e-5);
  EXPECT_NEAR(v[1], preds.argmax(1).eq(targets).to(torch::kFloat).mean().item<double>(), 1e-6);
}

TEST_F(LearnerTest, CustomOptimizerAndMetric) {
  Metric top2{"top2", [](const torch::Tensor& p, const torch::Tensor& y) {
                return std::get<1>(p.topk(2)).eq(y.unsqueeze(1)).any(1).to(torch::kFloat).mean();
              }};
  Learner learn(torch::nn::Linear(4, 3), blob_loaders(), cross_entropy(),
                LearnerOptions().progress(false).opt_func(sgd(0.9)).metrics({top2}));
  learn.fit(2, 0.05);
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(&learn.opt()), nullptr);
  EXPECT_GT(learn.recorder().values().back().metrics[0], 0.95);
}

TEST_F(LearnerTest, BadArgumentsAreClearErrors) {
  Learner learn(torch::nn::Linear(4, 3), blob_loaders(), cross_entropy(), LearnerOptions().progress(false));
  EXPECT_THROW_WITH(learn.fit(0), "Invalid n_epoch");
  EXPECT_THROW_WITH(learn.fit(1, -1.0), "Invalid lr");
  auto tiny = data::DataLoaders::from_split({test::blobs(4), test::blobs(4)}, 8, 0);
  Learner empty(torch::nn::Linear(4, 3), tiny, cross_entropy(), LearnerOptions().progress(false));
  EXPECT_THROW_WITH(empty.fit(1), "no full batch");
}

// An op that throws deep inside the model: the fit's error names the module and
// the op (the forward runs once more, watched, to find them), and keeps the op's message.
TEST_F(LearnerTest, AForwardErrorNamesTheModuleAndOp) {
  struct MisfitImpl : torch::nn::Module {
    MisfitImpl() : first(register_module("first", torch::nn::Linear(4, 3))), second(register_module("second", torch::nn::Linear(4, 3))) {}
    torch::Tensor forward(torch::Tensor x) {
      {
        ModuleScope scope("first");
        x = first(x);
      }
      ModuleScope scope("second");
      return second(x);  // takes 4 features, gets 3
    }
    torch::nn::Linear first, second;
  };
  TORCH_MODULE(Misfit);
  Learner learn(Misfit(), blob_loaders(), cross_entropy(), LearnerOptions().progress(false));
  // (libtorch's C++ Linear reaches the dispatcher as aten::addmm; a TorchScript one as aten::linear.)
  EXPECT_THROW_WITH(learn.fit(1, 1e-2), "the model's forward failed in second (aten::");
  EXPECT_THROW_WITH(learn.fit(1, 1e-2), "): mat1 and mat2 shapes cannot be multiplied");
  const auto site = locate_failure([&] { (void)learn.model().forward({torch::randn({2, 4})}); });
  ASSERT_TRUE(site.has_value());
  EXPECT_EQ(site->module, "second");
  EXPECT_EQ(site->op.rfind("aten::", 0), 0u) << site->op;
  EXPECT_FALSE(locate_failure([] {}).has_value());  // nothing failed: nothing to say
}

TEST_F(LearnerTest, ProgressPrintsOneLinePerEpochWhenNotATty) {
  std::ostringstream out;
  Learner learn(torch::nn::Linear(4, 3), blob_loaders(), cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
  learn.add_cb(std::make_shared<callbacks::ProgressCallback>(out, /*live=*/false));
  learn.fit(2, 1e-2);
  std::istringstream lines(out.str());
  std::vector<std::string> rows;
  for (std::string l; std::getline(lines, l);) rows.push_back(l);
  ASSERT_EQ(rows.size(), 3u);  // header + 2 epochs
  EXPECT_EQ(rows[0].rfind("epoch", 0), 0u);
  EXPECT_NE(rows[0].find("accuracy"), std::string::npos);
  EXPECT_EQ(rows[2].rfind("1 ", 0), 0u);
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
  EXPECT_EQ(callbacks::format_time(75), "01:15");
  EXPECT_EQ(callbacks::format_time(3725), "1:02:05");
}

TEST_F(LearnerTest, CsvLoggerAndSummaryFiles) {
  const std::string dir = test::scratch_dir("learner_logs");
  Learner learn(torch::nn::Linear(4, 3), blob_loaders(), cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
  learn.add_cb(std::make_shared<callbacks::CSVLogger>(dir));
  learn.add_cb(std::make_shared<callbacks::SummaryWriter>(
      callbacks::SummaryWriterOptions(dir + "/summary.json").integers({{"threads", 1}})));
  learn.fit(2, 1e-2);
  std::ifstream metrics(dir + "/metrics.csv"), steps(dir + "/steps.csv"), summary(dir + "/summary.json");
  std::string line;
  std::vector<std::string> mrows, srows;
  while (std::getline(metrics, line)) mrows.push_back(line);
  while (std::getline(steps, line)) srows.push_back(line);
  ASSERT_EQ(mrows.size(), 3u);
  EXPECT_EQ(mrows[0], "epoch,train_loss,valid_loss,accuracy,seconds");
  ASSERT_EQ(srows.size(), 1u + 32);
  EXPECT_EQ(srows[0], "iter,epoch,loss,smooth_loss,lr,scale,skipped,grad_norm,mom");
  // fp32: no scale, not skipped, no grad norm (no clipping); AdamW's beta1 as the momentum.
  EXPECT_NE(srows[1].find(",,0,,0.9"), std::string::npos) << srows[1];
  EXPECT_EQ(srows[32].rfind("31,1,", 0), 0u);
  const std::string json((std::istreambuf_iterator<char>(summary)), std::istreambuf_iterator<char>());
  for (const char* key : {"\"precision\": \"fp32\"", "\"epochs\": 2", "\"train_loss\"", "\"valid_loss\"",
                          "\"valid_accuracy\"", "\"seconds\"", "\"samples_per_second\"", "\"threads\": 1",
                          "\"torch_version\""})
    EXPECT_NE(json.find(key), std::string::npos) << key << " missing in " << json;
}

TEST_F(LearnerTest, FashionMnistCnnLearns) {
  if (!std::filesystem::exists(std::string(data::kFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  configure_threads(0);
  auto split = data::fashion_mnist();
  split.train = split.train.head(6000);
  split.valid = split.valid.head(2000);
  Learner learn(models::simple_cnn(), data::DataLoaders::from_split(split, 128, 42), cross_entropy(),
                LearnerOptions().progress(false).metrics({accuracy()}));
  learn.fit_one_cycle(1, 3e-3);
  EXPECT_GT(learn.recorder().values().back().metrics[0], 0.75);
  EXPECT_THROW_WITH(run::build_builtin_model("vgg"), "unknown model 'vgg' (choices: cnn, mlp, resnet, transformer)");
}

} // namespace

namespace {

// fastai's default wd_bn_bias=False: norm layers' parameters and biases get no
// weight decay; wd_bn_bias(true) decays everything, as before.
TEST(LearnerOptimizerTest, NormParametersAndBiasesAreNotDecayedByDefault) {
  using namespace mixtrain;
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                              torch::nn::Linear(8, 3));
  auto dls = data::DataLoaders::from_split({test::blobs(64), test::blobs(32)}, 16, 1);
  Learner learn(model, dls, cross_entropy(), LearnerOptions().progress(false));
  auto& groups = learn.opt().param_groups();
  ASSERT_EQ(groups.size(), 2u);
  auto wd = [](torch::optim::OptimizerParamGroup& g) {
    return static_cast<torch::optim::AdamWOptions&>(g.options()).weight_decay();
  };
  EXPECT_EQ(wd(groups[0]), 0.01);
  EXPECT_EQ(wd(groups[1]), 0.0);
  ASSERT_EQ(groups[0].params().size(), 2u);  // the two Linear weights
  EXPECT_TRUE(groups[0].params()[0].is_same(model[0]->as<torch::nn::Linear>()->weight));
  EXPECT_EQ(groups[1].params().size(), 4u);  // two biases, BatchNorm's weight and bias
  learn.fit(1, 1e-2);  // and it trains with two groups (schedules set every group)

  Learner all(torch::nn::Linear(4, 3), dls, cross_entropy(), LearnerOptions().progress(false).wd_bn_bias(true));
  EXPECT_EQ(all.opt().param_groups().size(), 1u);
}

} // namespace
