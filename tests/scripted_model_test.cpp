// Bring your own model: TorchScript files exported by python3-torch at test time,
// torch.save'd data, several inputs, the losses, the trained model as a file,
// and the built-in resnet and transformer.
#include "cli_util.h"
#include "test_util.h"

#include <mixtrain/mixtrain.h>
#include <nlohmann/json.hpp>
#include <torch/script.h>

#include <cmath>
#include <cstdio>
#include <mutex>
#include <unistd.h>

namespace {

using namespace mixtrain;
using test::expect_usage_error;
using test::run_cli;

/// The models and data files tests/python/export_models.py writes, exported once per process.
const std::string& exported() { return test::exported_by("export_models.py"); }

std::string exported_file(const std::string& name) { return exported() + "/" + name; }

/// The number on a "key value" line of the CLI's or a script's output.
double number_after(const std::string& text, const std::string& key) {
  const size_t at = text.rfind(key);
  EXPECT_NE(at, std::string::npos) << text;
  return at == std::string::npos ? NAN : std::atof(text.c_str() + at + key.size());
}

double accuracy_of(const torch::Tensor& logits, const torch::Tensor& y) {
  return logits.argmax(-1).eq(y).to(torch::kDouble).mean().item<double>();
}

class ScriptedModelTest : public test::SeededTest {};

TEST_F(ScriptedModelTest, ParametersAndBuffersHaveTheirPythonPathsAndAreTheScriptsOwn) {
  Model model = load_scripted_model(exported_file("traced_conv.pt"));
  EXPECT_TRUE(is_scripted(model));
  std::vector<std::string> names;
  for (const auto& p : model.module().named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names.front(), "features.0.weight");
  EXPECT_EQ(names.back(), "classifier.bias");
  EXPECT_TRUE(model.module().named_buffers().contains("features.1.running_mean"));
  // BatchNorm layers are recognized as norm layers (master weights keep them fp32, wd_bn_bias skips them).
  int64_t norms = 0;
  for (const auto& m : model.module().modules()) norms += is_norm_layer(*m);
  EXPECT_EQ(norms, 2);
  // train() and eval() reach the script: the running statistics move in train mode only.
  // (A scripted model: torch.jit.trace bakes in the mode it was traced in.)
  model = load_scripted_model(exported_file("scripted_conv.pt"));
  const torch::Tensor x = torch::randn({8, 1, 12, 12}) * 3 + 1;
  const torch::Tensor before = model.module().named_buffers()["features.1.running_mean"].clone();
  model.module().eval();
  model.forward(x);
  EXPECT_TRUE(torch::equal(before, model.module().named_buffers()["features.1.running_mean"]));
  model.module().train();
  model.forward(x);
  EXPECT_FALSE(torch::equal(before, model.module().named_buffers()["features.1.running_mean"]));
}

TEST_F(ScriptedModelTest, ATracedModelTrainsAndItsCheckpointRestoresIntoAFreshLoad) {
  const data::DatasetSplit split = data::load_tensor_file(exported_file("stripes_data.pt"), 42);
  Learner learn(load_scripted_model(exported_file("traced_conv.pt")), data::DataLoaders::from_split(split, 32, 0),
                cross_entropy(), LearnerOptions().metrics({accuracy()}).progress(false));
  learn.fit_one_cycle(2, 1e-2);
  EXPECT_GT(learn.recorder().values().back().metrics[0], 0.9);
  const std::string ckpt = test::scratch_dir("scripted_ckpt") + "/c.pt";
  learn.save(ckpt);
  Learner fresh(load_scripted_model(exported_file("traced_conv.pt")), data::DataLoaders::from_split(split, 32, 0),
                cross_entropy(), LearnerOptions().metrics({accuracy()}).progress(false));
  fresh.load(ckpt);
  test::expect_bitwise_equal(learn.model().state_tensors(), fresh.model().state_tensors());
}

TEST_F(ScriptedModelTest, MasterWeightsKeepAScriptedBatchNormInFp32) {
  const data::DatasetSplit split = data::load_tensor_file(exported_file("stripes_data.pt"), 42);
  Learner learn(load_scripted_model(exported_file("scripted_conv.pt")), data::DataLoaders::from_split(split, 32, 0),
                cross_entropy(), LearnerOptions().progress(false));
  learn.set_precision(Precision::kBf16Master);
  learn.fit(1, 1e-3);
  const auto params = learn.model().module().named_parameters();
  EXPECT_EQ(params["features.0.weight"].scalar_type(), torch::kBFloat16);
  EXPECT_EQ(params["features.1.weight"].scalar_type(), torch::kFloat);
  EXPECT_TRUE(std::isfinite(learn.recorder().values().back().valid_loss));
}

TEST_F(ScriptedModelTest, AnExportedModelFineTunesWithItsFeaturesFrozen) {
  // The fine-tuning path: a PyTorch model split at its Python attribute names,
  // the feature extractor frozen while the classifier trains, then everything.
  const data::DatasetSplit split = data::load_tensor_file(exported_file("stripes_data.pt"), 42);
  Learner learn(load_scripted_model(exported_file("scripted_conv.pt")), data::DataLoaders::from_split(split, 32, 0),
                cross_entropy(),
                LearnerOptions().progress(false).metrics({accuracy()}).splitter(split_at({"classifier"})).train_bn(false));
  ASSERT_EQ(learn.n_groups(), 2);
  auto params = learn.model().module().named_parameters();
  const torch::Tensor conv = params["features.0.weight"].detach().clone();
  const torch::Tensor head = params["classifier.weight"].detach().clone();
  learn.freeze();
  learn.fit_one_cycle(1, 1e-2);
  EXPECT_TRUE(torch::equal(params["features.0.weight"], conv));
  EXPECT_FALSE(torch::equal(params["classifier.weight"], head));
  learn.unfreeze();
  learn.fit_one_cycle(1, lr_slice(1e-3, 1e-2));
  EXPECT_FALSE(torch::equal(params["features.0.weight"], conv));
  EXPECT_GT(learn.recorder().values().back().metrics[0], 0.9);
}

TEST_F(ScriptedModelTest, ANativeModuleWithTwoInputsTrains) {
  struct TwoInputsImpl : torch::nn::Module {
    torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 3))};
    torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& scale) { return fc(x * scale); }
  };
  auto net = std::make_shared<TwoInputsImpl>();
  Model model(net, [net](const ModelInputs& in) { return net->forward(in[0], in[1]); }, 2);
  data::Dataset train = test::blobs(256, 3, 4, 1), valid = test::blobs(64, 3, 4, 2);
  train.extra_x = {torch::ones({256, 4})};
  valid.extra_x = {torch::ones({64, 4})};
  Learner learn(model, data::DataLoaders::from_split({train, valid}, 32, 0), cross_entropy(),
                LearnerOptions().metrics({accuracy()}).progress(false));
  learn.fit_one_cycle(3, 3e-2);
  EXPECT_GT(learn.recorder().values().back().metrics[0], 0.9);
  EXPECT_THROW_WITH(model.forward(train.x), "The model's forward takes 2 inputs but the data has 1");
}

// A native module that computes its loss (forward(x, y) -> logits and loss): the
// Learner passes the targets, trains on the model's loss (fp32 even when the model
// computes it in bf16) as it would with the same loss outside, and get_preds
// returns the logits.
TEST_F(ScriptedModelTest, ANativeModuleThatComputesItsLossTrainsOnIt) {
  struct OwnLossImpl : torch::nn::Module {
    torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 3))};
    int64_t calls_with_targets = 0;
    std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& y) {
      ++calls_with_targets;
      torch::Tensor logits = fc(x);
      return {logits, torch::nn::functional::cross_entropy(logits, y)};
    }
  };
  const data::Dataset train = test::blobs(256, 3, 4, 1), valid = test::blobs(64, 3, 4, 2);
  for (const Precision precision : {Precision::kFp32, Precision::kBf16Master}) {
    SCOPED_TRACE(precision_name(precision));
    torch::manual_seed(3);
    auto net = std::make_shared<OwnLossImpl>();
    Model model(net, [net](const ModelInputs& in) {
      auto [logits, loss] = net->forward(in.at(0), in.at(1));
      return ModelOutput{logits, loss, "logits and loss"};
    }, 2, /*takes_targets=*/true);
    Learner own(model, data::DataLoaders::from_split({train, valid}, 32, 0), model_loss(model),
                LearnerOptions().metrics({accuracy()}).progress(false));
    own.set_precision(precision);
    own.fit_one_cycle(3, 3e-2);
    EXPECT_EQ(net->calls_with_targets, 3 * (256 / 32 + 64 / 32));
    EXPECT_EQ(own.loss().scalar_type(), torch::kFloat);
    const auto [preds, targets] = own.get_preds();
    EXPECT_EQ(preds.sizes(), (std::vector<int64_t>{64, 3}));
    // The same weights trained with the same loss computed outside the model.
    torch::manual_seed(3);
    auto same = std::make_shared<OwnLossImpl>();
    Learner outside(Model(same->fc), data::DataLoaders::from_split({train, valid}, 32, 0), cross_entropy(),
                    LearnerOptions().metrics({accuracy()}).progress(false));
    outside.set_precision(precision);
    outside.fit_one_cycle(3, 3e-2);
    const auto& a = own.recorder().values().back();
    const auto& b = outside.recorder().values().back();
    if (precision == Precision::kFp32) EXPECT_TRUE(torch::equal(net->fc->weight, same->fc->weight));  // the same arithmetic
    // bf16-master: the model's loss is computed from bf16 logits, the outside one from fp32 (loss_fp32).
    EXPECT_NEAR(a.valid_loss, b.valid_loss, precision == Precision::kFp32 ? 1e-6 : 0.02 * b.valid_loss);
    EXPECT_NEAR(a.metrics[0], b.metrics[0], precision == Precision::kFp32 ? 0 : 2.0 / 64);
  }
  // A model that does not take the targets computes no loss; one that returned none says what it returned.
  auto plain = torch::nn::Linear(4, 3);
  EXPECT_THROW_WITH(model_loss(Model(plain)), "the model does not take the targets");
  auto net = std::make_shared<OwnLossImpl>();
  Model silent(net, [net](const ModelInputs& in) { return ModelOutput{net->fc(in.at(0)), {}, "a tensor"}; }, 2, true);
  silent.forward({torch::randn({2, 4}), torch::zeros({2}, torch::kLong)});
  EXPECT_THROW_WITH(model_loss(silent)(torch::Tensor(), torch::Tensor()),
                    "does not fit: the model returns a tensor, with no loss");
}

TEST_F(ScriptedModelTest, ScriptedInputCountIsCheckedWithTheArgumentNames) {
  Model model = load_scripted_model(exported_file("two_inputs.pt"));
  EXPECT_THROW_WITH(model.forward(torch::randn({2, 20})), "forward takes 2 inputs (x, mask) but the data has 1");
  EXPECT_EQ(model.forward({torch::randn({2, 20}), torch::ones({2, 20})}).sizes(), (std::vector<int64_t>{2, 3}));
}

TEST(LossTest, SequenceCrossEntropyIsTheFlattenedOne) {
  torch::manual_seed(0);
  const torch::Tensor logits = torch::randn({2, 5, 7}), y = torch::randint(0, 7, {2, 5});
  EXPECT_TRUE(torch::allclose(cross_entropy()(logits, y),
                              torch::nn::functional::cross_entropy(logits.reshape({10, 7}), y.reshape({10}))));
  EXPECT_THROW_WITH(cross_entropy()(torch::randn({4, 3}), torch::randint(0, 3, {5})),
                    "the model's output [4, 3] does not fit the targets [5] for cross_entropy");
  EXPECT_THROW_WITH(cross_entropy()(torch::randn({4, 3}), torch::rand({4})), "cross_entropy needs integer class targets");
  EXPECT_THROW_WITH(mse()(torch::randn({4, 3}), torch::randint(0, 3, {4, 3})), "mse needs float targets");
  EXPECT_THROW_WITH(mse()(torch::randn({4, 2}), torch::randn({4})), "output [4, 2] does not fit the targets [4] for mse");
  const torch::Tensor p = torch::randn({4, 1}), t = torch::randn({4});
  EXPECT_TRUE(torch::allclose(mse()(p, t), torch::mse_loss(p.squeeze(1), t)));
  EXPECT_TRUE(torch::allclose(bce_with_logits()(p, (t > 0).to(torch::kLong)),
                              torch::binary_cross_entropy_with_logits(p.squeeze(1), (t > 0).to(torch::kFloat))));
  EXPECT_THROW_WITH(loss_by_name("hinge"), "choices: cross_entropy, mse, bce_with_logits");
}

TEST(TensorFileTest, WithoutValidationDataASeededFifthIsKeptAside) {
  const data::DatasetSplit a = data::load_tensor_file(exported_file("stripes_data.pt"), 7);
  const data::DatasetSplit b = data::load_tensor_file(exported_file("stripes_data.pt"), 7);
  const data::DatasetSplit c = data::load_tensor_file(exported_file("stripes_data.pt"), 8);
  EXPECT_EQ(a.train.size(), 615);  // 768 - floor(0.2 * 768)
  EXPECT_EQ(a.valid.size(), 153);
  EXPECT_TRUE(torch::equal(a.valid.x, b.valid.x));
  EXPECT_FALSE(torch::equal(a.valid.x, c.valid.x));
  // Disjoint: every sample is in exactly one of the two.
  const torch::Tensor all = torch::cat({a.train.x, a.valid.x}).flatten(1).sum(1);
  const data::DatasetSplit whole = data::load_tensor_file(exported_file("two_inputs_data.pt"), 7);
  EXPECT_EQ(whole.train.extra_x.size(), 1u);  // [x, mask]
  EXPECT_EQ(whole.valid.size(), 256);         // its own valid_x / valid_y
  EXPECT_EQ(all.size(0), 768);
  EXPECT_EQ(std::get<0>(torch::_unique(all)).size(0), 768);
}

TEST(TensorFileTest, BadFilesAreOneLineErrors) {
  EXPECT_THROW_WITH(data::load_tensor_file(exported_file("short_y.pt")), "x has 768 samples but y has 100");
  EXPECT_THROW_WITH(data::load_tensor_file(exported_file("y_not_tensor.pt")), "'y' is a list, not a tensor");
  EXPECT_THROW_WITH(data::load_tensor_file(exported_file("no_y.pt")), "has no 'y' (it needs 'x' and 'y'");
  EXPECT_THROW_WITH(data::load_tensor_file(exported_file("traced_conv.pt")), "is not a file written by torch.save");
  EXPECT_THROW_WITH(data::load_tensor_file(exported_file("nothere.pt")), "Cannot open data file");
}

TEST(ModelFileTest, ABuiltInModelRoundTripsAndPredicts) {
  torch::manual_seed(0);
  Model cnn = run::build_builtin_model("cnn");
  cnn.module().eval();
  const torch::Tensor x = torch::randn({10, 1, 28, 28});
  const std::string path = test::scratch_dir("model_file") + "/cnn.pt";
  save_model(cnn, path, "cnn");
  Model loaded = load_model(path);
  EXPECT_FALSE(loaded.module().is_training());
  EXPECT_TRUE(torch::equal(predict(cnn, {x}, 4), predict(loaded, {x}, 4)));
  EXPECT_TRUE(torch::allclose(predict(cnn, {x}, 3), predict(loaded, {x}, 10), 1e-5, 1e-6));
  EXPECT_THROW_WITH(save_model(cnn, path), "needs its built-in name");
  EXPECT_THROW_WITH(load_model(exported_file("state_dict.pt")), "is a torch.save'd file (a state_dict or a pickled module), not TorchScript");
}

// A built-in model's file is unpickled as checkpoints and TorchScript files are: walked,
// bounded, and every tensor checked against the record that holds it. A storage record cut
// short (its CRC kept valid) was read past before, as the hostile tester's checkpoint was.
TEST(ModelFileTest, AModelFileWhoseRecordIsShorterThanItsClaimIsRefused) {
  torch::manual_seed(0);
  Model cnn = run::build_builtin_model("cnn");
  const std::string dir = test::scratch_dir("model_file_cut");
  save_model(cnn, dir + "/cnn.pt", "cnn");
  ASSERT_EQ(std::system((MIXTRAIN_PYTHON " " MIXTRAIN_SOURCE_DIR "/tests/python/cut_record.py " + dir + "/cnn.pt " + dir +
                         "/cut.pt 576 100").c_str()),
            0);  // the first conv's weight: 16 x 1 x 3 x 3 floats
  EXPECT_THROW_WITH(load_model(dir + "/cut.pt"), "needs 576 bytes of data but the file holds 100 for it");
  EXPECT_NO_THROW(load_model(dir + "/cnn.pt"));
}

TEST(BuiltinModelsTest, TheTransformerIsCausalAndTheResnetClassifies) {
  torch::manual_seed(0);
  models::TransformerLM lm;
  lm->eval();
  torch::Tensor tokens = torch::randint(0, 256, {2, 16});
  const torch::Tensor a = lm->forward(tokens);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, 16, 256}));
  tokens.index_put_({torch::indexing::Slice(), 10}, 7);  // change a later token
  const torch::Tensor b = lm->forward(tokens);
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::allclose(a.index({Slice(), Slice(0, 10)}), b.index({Slice(), Slice(0, 10)})));
  EXPECT_FALSE(torch::allclose(a.index({Slice(), 10}), b.index({Slice(), 10})));
  EXPECT_THROW_WITH(lm->forward(torch::zeros({1, 65}, torch::kLong)), "context is 64 tokens, got 65");
  auto resnet = models::resnet();
  EXPECT_EQ(resnet->forward(torch::randn({3, 1, 28, 28})).sizes(), (std::vector<int64_t>{3, 10}));
}

TEST(TextCorpusTest, SamplesAreTheTextAndItsNextCharacters) {
  const std::string path = test::scratch_dir("corpus") + "/text.txt";
  std::string text;
  for (int i = 0; i < 50; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(path) << text;
  const data::DatasetSplit s = data::text_corpus(path, 16, 0.2);
  EXPECT_EQ(s.train.x.size(1), 16);
  EXPECT_EQ(s.train.x[0][0].item<int64_t>(), 't');
  EXPECT_TRUE(torch::equal(s.train.x[0].slice(0, 1), s.train.y[0].slice(0, 0, 15)));
  EXPECT_EQ(s.train.size(), static_cast<int64_t>(text.size() * 4 / 5 - 1) / 16);
  // Unigram perplexity: between 1 and the number of distinct characters (29 here, smoothed over 256).
  const double ppl = data::unigram_perplexity(s);
  EXPECT_GT(ppl, 10);
  EXPECT_LT(ppl, 29);
  EXPECT_THROW_WITH(data::text_corpus(test::scratch_dir("corpus") + "/none"), "Text corpus not found");
}

// ---- The CLI, as the README's "Diagnose your PyTorch model" section uses it.

// A model file saved in bf16 (model.to(torch.bfloat16) before saving) is the user's pure-bf16
// setup: the CLI follows the rule Python follows (run/stored_model.h), and an fp16 file is
// one line.
TEST(ScriptedCliTest, ABf16ModelFileTrainsAsBf16PureUnlessChosenAndAnFp16FileIsOneLine) {
  const std::string dir = test::scratch_dir("byo_sixteen_bit_files");
  torch::jit::Module script = torch::jit::load(exported_file("traced_conv.pt"));
  script.to(torch::kBFloat16);
  script.save(dir + "/bf16.pt");
  script.to(torch::kHalf);
  script.save(dir + "/fp16.pt");
  const std::string common = " --data " + exported_file("stripes_data.pt") + " --limit 256 --epochs 1 --bs 32 --threads 1 --force --out ";
  auto r = run_cli("train --model " + dir + "/bf16.pt" + common + dir + "/chosen");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("the model's parameters are bf16: training it as bf16-pure"), std::string::npos) << r.err;
  EXPECT_EQ(test::read_json(dir + "/chosen/args.json")["precision"], "bf16-pure");
  // The caller's mode: the bf16 values train in it (before the rule, the file did not run at all).
  r = run_cli("train --model " + dir + "/bf16.pt --precision fp32" + common + dir + "/fp32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("parameters are bf16"), std::string::npos) << r.err;
  EXPECT_EQ(test::read_json(dir + "/fp32/args.json")["precision"], "fp32");
  expect_usage_error("train --model " + dir + "/fp16.pt" + common + dir + "/fp16",
                     "the model's parameters are fp16, which mixtrain does not train without an fp32 copy");
  EXPECT_FALSE(std::filesystem::exists(dir + "/fp16"));
}

// A model file that libtorch would fail deep inside the run (float64 weights, every parameter
// frozen) is one line before the run starts, as in Python.
TEST(ScriptedCliTest, AFloat64OrAllFrozenModelFileIsOneLineAndNoFolder) {
  const std::string dir = test::scratch_dir("byo_untrainable_files");
  torch::jit::Module script = torch::jit::load(exported_file("traced_conv.pt"));
  script.to(torch::kDouble);
  script.save(dir + "/f64.pt");
  script.to(torch::kFloat);
  for (const auto& p : script.parameters()) p.requires_grad_(false);
  script.save(dir + "/frozen.pt");
  const std::string common = " --data " + exported_file("stripes_data.pt") + " --limit 256 --epochs 1 --bs 32 --threads 1 --out ";
  expect_usage_error("train --model " + dir + "/f64.pt" + common + dir + "/f64",
                     "the model's parameters are float64: mixtrain trains fp32 models (in mixed precision); pass model.float()");
  EXPECT_FALSE(std::filesystem::exists(dir + "/f64"));
  expect_usage_error("doctor --model " + dir + "/frozen.pt" + common + dir + "/frozen",
                     "every parameter of the model is frozen");
  EXPECT_FALSE(std::filesystem::exists(dir + "/frozen"));
}


TEST(ScriptedCliTest, TwoInputsTrainInEmulatedFp16AndPythonReadsTheSameAccuracy) {
  const std::string out = test::scratch_dir("byo_two_inputs");
  const auto r = run_cli("train --model " + exported_file("two_inputs.pt") + " --data " + exported_file("two_inputs_data.pt") +
                         " --precision fp16 --epochs 3 --bs 64 --lr 1e-2 --threads 1 --force --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  const double trained = number_after(r.out, "valid accuracy ");
  EXPECT_GT(trained, 0.7);
  // Python's torch.jit.load reads OUT/model.pt; it and mixtrain's predict agree exactly (both fp32).
  const std::string cmd = std::string(MIXTRAIN_PYTHON " ") + MIXTRAIN_SOURCE_DIR + "/tests/python/eval_model.py " +
                          out + "/model.pt " + exported_file("two_inputs_data.pt") + " > " + out + "/py.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::slurp(out + "/py.txt");
  const double python = number_after(test::slurp(out + "/py.txt"), "accuracy ");
  const data::DatasetSplit split = data::load_tensor_file(exported_file("two_inputs_data.pt"));
  const double cpp = accuracy_of(predict(load_model(out + "/model.pt"), {split.valid.x, split.valid.extra_x.at(0)}), split.valid.y);
  EXPECT_NEAR(python, cpp, 1e-6);  // the script prints six decimals
  // Training validated in emulated fp16; fp32 inference may flip a borderline sample or two of 256.
  EXPECT_NEAR(python, trained, 3.0 / 256);
}

// torchvision's models come from .venv-cuda (torch 2.14.1 with torchvision 0.29.1), which
// `make test` makes: the TorchScript file it writes loads in the torch we build against.
TEST(ScriptedCliTest, RealCpuBf16TrainsAndValidatesTorchvisionsViT) {
  const std::string torchvision_python = MIXTRAIN_TORCHVISION_PYTHON;
  if (torchvision_python.empty()) GTEST_SKIP() << "no .venv-cuda (scripts/setup.sh --cuda) when the build was configured";
  const std::string dir = test::exported_by("export_torchvision.py", torchvision_python);
  const std::string out = test::scratch_dir("byo_vit_bf16");
  // Validation runs nn.MultiheadAttention's fused kernel under real CPU bf16 autocast (forced on any CPU).
  const auto r = run_cli("train --model " + dir + "/torchvision_vit.pt --data " + dir +
                             "/images32_data.pt --precision bf16 --epochs 1 --bs 32 --threads 1 --force --out " + out,
                         "MIXTRAIN_CPU_BF16=1 ");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("emulated"), std::string::npos) << r.err;  // real bf16, no fallback
  const auto summary = nlohmann::json::parse(test::slurp(out + "/summary.json"));
  EXPECT_FALSE(summary.at("emulated").get<bool>());
  EXPECT_TRUE(std::isfinite(number_after(r.out, "valid loss ")));
}

// Real CPU bf16 is forced (MIXTRAIN_CPU_BF16=1): the path a CPU with bf16 units takes,
// on any CPU (only slower without the units).
TEST(ScriptedCliTest, AModelRealCpuBf16CannotRunFallsBackToTheEmulationOnce) {
  const std::string real = "MIXTRAIN_CPU_BF16=1 ";
  const std::string args = "train --model " + exported_file("scatter_sum.pt") + " --data " + exported_file("blobs_split.pt") +
                           " --precision bf16 --epochs 2 --bs 64 --threads 1 --force --out ";
  const std::string fallback_out = test::scratch_dir("byo_scatter_fallback");
  const auto fell_back = run_cli(args + fallback_out, real);
  ASSERT_EQ(fell_back.code, 0) << fell_back.err;
  const std::string notice = "real CPU bf16 autocast cannot run this model (in aten::index_add_: index_add_()";
  EXPECT_NE(fell_back.err.find(notice), std::string::npos) << fell_back.err;
  EXPECT_EQ(fell_back.err.find(notice), fell_back.err.rfind(notice)) << "one notice: " << fell_back.err;
  // It fell back at the first forward: the run is the emulated run from its first step.
  const auto emulated = run_cli(args + test::scratch_dir("byo_scatter_emulated"), "MIXTRAIN_CPU_BF16=0 ");
  ASSERT_EQ(emulated.code, 0) << emulated.err;
  EXPECT_EQ(number_after(fell_back.out, "valid loss "), number_after(emulated.out, "valid loss "));
  EXPECT_EQ(nlohmann::json::parse(test::slurp(fallback_out + "/summary.json")).at("emulated"), true);
}

// A model whose gap shows only when validating falls back an epoch in; the checkpoint
// records it, so a resume goes on emulated, bitwise the uninterrupted run (it went on real
// until the next validation, and steps.csv differed from there).
TEST(ScriptedCliTest, AResumeAfterTheFallbackGoesOnEmulated) {
  const std::string real = "MIXTRAIN_CPU_BF16=1 ";
  const std::string args = "train --model " + exported_file("scatter_in_eval.pt") + " --data " + exported_file("blobs_split.pt") +
                           " --precision bf16 --epochs 3 --bs 64 --threads 1 --force --out ";
  const std::string whole_out = test::scratch_dir("scatter_eval_whole"), cut_out = test::scratch_dir("scatter_eval_cut");
  const auto whole = run_cli(args + whole_out, real);
  ASSERT_EQ(whole.code, 0) << whole.err;
  EXPECT_NE(whole.err.find("real CPU bf16 autocast cannot run this model"), std::string::npos) << whole.err;
  const auto cut = run_cli(args + cut_out + " --interrupt-at-step 15", real);  // epoch 2 of 12 steps each
  ASSERT_EQ(cut.code, 130) << cut.err;
  const auto resumed = run_cli("train --resume " + cut_out, real);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(test::slurp(cut_out + "/steps.csv"), test::slurp(whole_out + "/steps.csv"));
  EXPECT_EQ(number_after(resumed.out, "valid loss "), number_after(whole.out, "valid loss "));
}

nlohmann::json doctor(const std::string& model, const std::string& data, const std::string& name) {
  const std::string out = test::scratch_dir(name);
  const auto r = run_cli("doctor --model " + model + " --data " + data + " --bs 32 --lr 1e-2 --threads 1 --out " + out);
  EXPECT_NE(r.code, 2) << r.err;
  return nlohmann::json::parse(test::slurp(out + "/diagnosis.json"));
}

TEST(ScriptedCliTest, TheDoctorLocatesAScriptedAttentionOverflowAndPassesAHealthyConvNet) {
  const auto overflow = doctor(exported_file("attention_overflow.pt"), exported_file("sequences_data.pt"), "byo_doctor_overflow");
  EXPECT_EQ(overflow["verdict"], "forward_overflow") << overflow.dump(1);
  const std::string where = overflow.dump();
  // The score matmul uses no parameter: the module boundary names it.
  EXPECT_NE(where.find("aten::matmul in attn"), std::string::npos) << where;
  const auto healthy = doctor(exported_file("scripted_conv.pt"), exported_file("stripes_data.pt"), "byo_doctor_healthy");
  EXPECT_EQ(healthy["verdict"], "healthy") << healthy.dump(1);
}

// The attention classifier's logits overflow fp16 at step 0 while fp32 learns (slowly):
// forward_overflow, never "fp16 is not the cause", whatever the initial weights.
TEST(ScriptedCliTest, TheDoctorLocatesAnLstmOverflowAndProvesItsIsland) {
  const auto d = doctor(exported_file("embedding_lstm_overflow.pt"), exported_file("tokens_data.pt"), "byo_doctor_lstm");
  EXPECT_EQ(d["verdict"], "forward_overflow") << d.dump(1);
  EXPECT_NE(d["headline"].get<std::string>().find("at rnn (aten::lstm)"), std::string::npos) << d.dump(1);
  ASSERT_FALSE(d["trials"].empty()) << d.dump(1);
  EXPECT_EQ(d["trials"][0]["flags"], "--keep-fp32 rnn") << d.dump(1);
  EXPECT_EQ(d["proven_fix"]["flags"], "--keep-fp32 rnn") << d.dump(1);
}

TEST(ScriptedCliTest, AttentionOverflowIsForwardOverflowForEveryInitialWeights) {
  for (const std::string seed : {"", "_seed1", "_seed2", "_seed3", "_seed4"}) {
    SCOPED_TRACE(seed);
    const auto d = doctor(exported_file("attention_overflow" + seed + ".pt"), exported_file("sequences_data.pt"), "byo_attention" + seed);
    EXPECT_EQ(d["verdict"], "forward_overflow") << d.dump(1);
    EXPECT_NE(d.dump().find("--keep-fp32 attn"), std::string::npos) << d["fixes"].dump(1);
  }
}

// A ViT-like model whose patch embedding overflows fp16 on normalized inputs: the
// doctor names conv_proj and suggests keeping it in fp32, which trains as fp32 does.
TEST(ScriptedCliTest, KeepingAnOverflowingPatchEmbeddingInFp32TrainsLikeFp32) {
  const std::string flags = " --model " + exported_file("vit_patch_overflow.pt") + " --data " + exported_file("stripes_data.pt") +
                            " --bs 32 --epochs 3 --threads 1";
  const auto d = doctor(exported_file("vit_patch_overflow.pt"), exported_file("stripes_data.pt"), "byo_vit_doctor");
  EXPECT_EQ(d["verdict"], "forward_overflow") << d.dump(1);
  EXPECT_EQ(d["evidence"]["first_overflow"]["where"], "conv_proj (aten::conv2d)") << d.dump(1);
  EXPECT_EQ(d["evidence"]["inputs"]["unnormalized"], false);
  for (const auto& fix : d["fixes"]) EXPECT_EQ(fix.get<std::string>().find("normalize"), std::string::npos) << fix;
  EXPECT_EQ(d["fixes"][0], "keep conv_proj in fp32 (--keep-fp32 conv_proj): its ops run in fp32 and the rest stays fp16");
  // The doctor proves it: the first trial keeps conv_proj in fp32 and trains like fp32.
  ASSERT_FALSE(d["proven_fix"].is_null()) << d.dump(1);
  EXPECT_EQ(d["proven_fix"]["flags"], "--keep-fp32 conv_proj");
  EXPECT_EQ(d["proven_fix"]["api"], "PrecisionOptions().keep_fp32({\"conv_proj\"})");
  EXPECT_LT(std::abs(d["proven_fix"]["gap_percent"].get<double>()), 10.0);
  EXPECT_EQ(d["trials"][0]["fix"], "keep conv_proj in fp32");
  EXPECT_TRUE(d["trials"][0]["finite"].get<bool>());
  EXPECT_LE(d["trials"].size(), 4u);
  const std::string none = test::scratch_dir("byo_vit_no_trials");
  const auto quick = run_cli("doctor --model " + exported_file("vit_patch_overflow.pt") + " --data " + exported_file("stripes_data.pt") +
                             " --bs 32 --threads 1 --no-trials --out " + none);
  EXPECT_EQ(quick.code, 1) << quick.err;
  const auto q = nlohmann::json::parse(test::slurp(none + "/diagnosis.json"));
  EXPECT_TRUE(q["trials"].empty());
  EXPECT_TRUE(q["proven_fix"].is_null());
  expect_usage_error("doctor --max-trials -1", "invalid --max-trials -1: must be >= 0");
  expect_usage_error("train --no-trials", "mixtrain train does not take --no-trials (doctor does)");

  const std::string fp32 = test::scratch_dir("byo_vit_fp32"), fp16 = test::scratch_dir("byo_vit_fp16"),
                    island = test::scratch_dir("byo_vit_island");
  ASSERT_EQ(run_cli("train" + flags + " --out " + fp32).code, 0);
  EXPECT_EQ(run_cli("train" + flags + " --precision fp16 --out " + fp16).code, 1);  // NaN: stopped
  const auto r = run_cli("train" + flags + " --precision fp16 --keep-fp32 conv_proj --out " + island);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string steps = test::slurp(island + "/steps.csv");
  EXPECT_EQ(steps.find("nan"), std::string::npos);
  EXPECT_EQ(steps.find("inf"), std::string::npos);
  const auto a = nlohmann::json::parse(test::slurp(fp32 + "/summary.json")),
             b = nlohmann::json::parse(test::slurp(island + "/summary.json"));
  EXPECT_EQ(b["skipped_steps"], 0);
  EXPECT_NEAR(b["valid_accuracy"].get<double>(), a["valid_accuracy"].get<double>(), 0.05);
  EXPECT_GT(a["valid_accuracy"].get<double>(), 0.9);
  EXPECT_NE(test::slurp(island + "/args.json").find("\"keep_fp32\": [\n    \"conv_proj\"\n  ]"), std::string::npos);
}

// Islands that name nothing are one-line errors, before anything trains or is written.
TEST(ScriptedCliTest, BadIslandsAreOneLineErrors) {
  const std::string base = "train --model " + exported_file("vit_patch_overflow.pt") + " --data " + exported_file("stripes_data.pt") +
                           " --bs 32 --threads 1 --precision fp16 --out " + test::scratch_dir("byo_bad_islands");
  expect_usage_error(base + " --keep-fp32 conv_prj", "--keep-fp32 conv_prj matches no module of the model (closest: conv_proj");
  expect_usage_error(base + " --keep-fp32 ''", "an empty module name in --keep-fp32 ''");
  expect_usage_error(base + " --keep-fp32 conv_proj,", "an empty module name");
  expect_usage_error(base + " --keep-fp32 '*'", "matches every module of the model");
  expect_usage_error("doctor --model " + exported_file("vit_patch_overflow.pt") + " --data " + exported_file("stripes_data.pt") +
                         " --bs 32 --threads 1 --keep-fp32 layers.9 --out " + test::scratch_dir("byo_bad_islands_doctor"),
                     "--keep-fp32 layers.9 matches no module of the model");
  EXPECT_FALSE(std::filesystem::exists(test::scratch_dir("byo_bad_islands") + "/args.json"));
  const auto warned = run_cli("train --model " + exported_file("vit_patch_overflow.pt") + " --data " + exported_file("stripes_data.pt") +
                              " --bs 32 --threads 1 --keep-fp32 conv_proj --out " + test::scratch_dir("byo_fp32_islands"));
  EXPECT_EQ(warned.code, 0) << warned.err;
  EXPECT_NE(warned.err.find("mixtrain: warning: --keep-fp32 does nothing with --precision fp32 (the whole model is fp32)"),
            std::string::npos) << warned.err;
}

// Models that return a namedtuple, a dict or (output, lengths) train on the prediction
// chosen from it, in emulated fp16; --output picks another part; data saved in half is
// read as fp32; the doctor judges a dict-output model.
TEST(ScriptedCliTest, StructuredOutputsTrainOnTheChosenPrediction) {
  const std::string data = " --data " + exported_file("blobs_data.pt") + " --bs 32 --epochs 2 --threads 1 --precision fp16";
  const std::vector<std::pair<std::string, std::string>> models = {
      {"namedtuple_out.pt", "training on element 0 ('logits')"},
      {"dict_out.pt", "training on its 'logits'"},
      {"tuple_lengths_out.pt", "training on element 0"}};
  for (const auto& [model, notice] : models) {
    SCOPED_TRACE(model);
    const std::string out = test::scratch_dir("byo_structured_" + model);
    const auto r = run_cli("train --model " + exported_file(model) + data + " --out " + out);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find(notice), std::string::npos) << r.err;
    EXPECT_GT(number_after(r.out, "valid accuracy "), 0.5) << r.out;  // chance is 1/3
  }
  const std::string out = " --out " + test::scratch_dir("byo_structured_bad");
  expect_usage_error("train --model " + exported_file("dict_out.pt") + data + " --output hidden2" + out,
                     "--output hidden2 does not fit: the model returns a dict with keys hidden, logits");
  expect_usage_error("train --model " + exported_file("namedtuple_out.pt") + data + " --output 5" + out,
                     "--output 5 does not fit: the model returns a namedtuple of 2 (logits: Tensor, aux: Tensor)");
  const auto aux = run_cli("train --model " + exported_file("namedtuple_out.pt") + " --data " + exported_file("blobs_half_data.pt") +
                           " --bs 32 --threads 1 --output aux --out " + test::scratch_dir("byo_structured_half"));
  ASSERT_EQ(aux.code, 0) << aux.err;
  EXPECT_NE(aux.err.find("'x' is stored in Half; it is read as fp32"), std::string::npos) << aux.err;
  EXPECT_NE(aux.err.find("training on element 1 ('aux')"), std::string::npos) << aux.err;
  const auto healthy = doctor(exported_file("dict_out.pt"), exported_file("blobs_data.pt"), "byo_structured_doctor");
  EXPECT_EQ(healthy["verdict"], "healthy") << healthy.dump(1);
}

/// The validation accuracy a plain PyTorch loop (fp32, fastai's optimizer and schedule) reaches.
double plain_pytorch_accuracy(const std::string& model, const std::string& data, const std::string& loss,
                              const std::string& name) {
  const std::string log = test::scratch_dir(name) + "/plain.txt";
  const std::string cmd = std::string(MIXTRAIN_PYTHON " ") + MIXTRAIN_SOURCE_DIR + "/tests/python/plain_loop.py " +
                          model + " " + data + " 3 32 1e-2 " + loss + " > " + log + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << test::slurp(log);
  return number_after(test::slurp(log), "accuracy ");
}

// Every kind of structured output, and models that compute their loss from the
// labels (a Hugging Face dict and its (loss, logits) tuple), trained in emulated fp16,
// reach the accuracy a plain fp32 PyTorch loop reaches with the same model and data.
TEST(ScriptedCliTest, StructuredOutputsAndOwnLossesTrainInFp16AsAPlainPyTorchLoopDoes) {
  const std::string data = exported_file("blobs_split.pt");
  const std::vector<std::pair<std::string, std::string>> models = {{"namedtuple_out.pt", "cross_entropy"},
                                                                   {"dict_out_plain.pt", "cross_entropy"},
                                                                   {"tuple_lengths_out.pt", "cross_entropy"},
                                                                   {"hf_dict_loss.pt", "model"},
                                                                   {"hf_tuple_loss.pt", "model"}};
  for (const auto& [model, loss] : models) {
    SCOPED_TRACE(model);
    const std::string out = test::scratch_dir("byo_plain_" + model);
    const auto r = run_cli("train --model " + exported_file(model) + " --data " + data + " --loss " + loss +
                           " --precision fp16 --epochs 3 --bs 32 --lr 1e-2 --threads 1 --out " + out);
    ASSERT_EQ(r.code, 0) << r.err;
    const double python = plain_pytorch_accuracy(exported_file(model), data, loss, "byo_plain_py_" + model);
    EXPECT_GT(python, 0.85);  // the blobs are nearly separable; chance is 1/3
    // Different shuffles and fp16 vs fp32: a few of 256 validation samples apart, never more.
    EXPECT_NEAR(number_after(r.out, "valid accuracy "), python, 0.04) << r.out;
    EXPECT_EQ(test::read_json(out + "/summary.json").at("skipped_steps"), 0) << r.out;
  }
}

// A model's own loss, told apart from its prediction: the dict's 'loss', a tuple's
// scalar first element, a bare scalar (no prediction, so no metric); it resumes
// bitwise, and the trained model.pt still returns what it returned.
TEST(ScriptedCliTest, AModelsOwnLossIsFoundInEachShapeAndResumesBitwise) {
  const std::string base = " --data " + exported_file("blobs_split.pt") + " --loss model --precision fp16 --bs 32 --lr 1e-2 --threads 1";
  const auto dict = run_cli("train --model " + exported_file("hf_dict_loss.pt") + base + " --out " + test::scratch_dir("own_loss_dict"));
  ASSERT_EQ(dict.code, 0) << dict.err;
  EXPECT_NE(dict.err.find("the model returns a dict with keys logits, loss; its 'loss' is the loss, training on its 'logits'"),
            std::string::npos) << dict.err;
  const auto tuple = run_cli("train --model " + exported_file("hf_tuple_loss.pt") + base + " --out " + test::scratch_dir("own_loss_tuple"));
  ASSERT_EQ(tuple.code, 0) << tuple.err;
  EXPECT_NE(tuple.err.find("element 0 is the loss, training on element 1"), std::string::npos) << tuple.err;
  const std::string bare = test::scratch_dir("own_loss_bare");
  const auto scalar = run_cli("train --model " + exported_file("loss_only.pt") + base + " --epochs 2 --out " + bare);
  ASSERT_EQ(scalar.code, 0) << scalar.err;
  EXPECT_EQ(scalar.out.find("accuracy"), std::string::npos) << scalar.out;  // a loss is no prediction
  const auto epochs = test::read_json(bare + "/summary.json");
  EXPECT_LT(epochs.at("valid_loss").get<double>(), 0.7) << scalar.out;  // ln 3 = 1.10 at chance

  // Interrupted after step 30 and resumed: the same weights as the uninterrupted run.
  const std::string flags = " --model " + exported_file("hf_dict_loss.pt") + base + " --epochs 2 --save-every 1";
  const std::string full = test::scratch_dir("own_loss_full"), cut = test::scratch_dir("own_loss_cut");
  ASSERT_EQ(run_cli("train" + flags + " --out " + full).code, 0);
  EXPECT_EQ(run_cli("train" + flags + " --out " + cut + " --interrupt-at-step 30").code, 130);
  ASSERT_EQ(run_cli("train --resume " + cut).code, 0);
  EXPECT_EQ(test::slurp(full + "/model.pt"), test::slurp(cut + "/model.pt"));
  // model.pt is the TorchScript model as it was: given labels, its forward returns the loss too.
  Model trained = load_model(full + "/model.pt");
  const data::DatasetSplit split = data::load_tensor_file(exported_file("blobs_split.pt"));
  const double accuracy = accuracy_of(predict(trained, {split.valid.x}), split.valid.y);
  EXPECT_NEAR(accuracy, test::read_json(full + "/summary.json").at("valid_accuracy").get<double>(), 3.0 / 256);
}

// The doctor reaches into a dict output: an overflowing projection is named (op and
// module) and its fp32 island proven; a model that computes its loss is healthy.
TEST(ScriptedCliTest, TheDoctorNamesAnOverflowInsideADictModelAndJudgesOwnLosses) {
  const auto overflow = doctor(exported_file("dict_overflow.pt"), exported_file("blobs_split.pt"), "byo_dict_overflow");
  EXPECT_EQ(overflow["verdict"], "forward_overflow") << overflow.dump(1);
  EXPECT_EQ(overflow["evidence"]["first_overflow"]["where"], "proj (aten::linear)") << overflow.dump(1);
  ASSERT_FALSE(overflow["proven_fix"].is_null()) << overflow.dump(1);
  EXPECT_EQ(overflow["proven_fix"]["flags"], "--keep-fp32 proj");
  const std::string out = test::scratch_dir("byo_own_loss_doctor");
  const auto r = run_cli("doctor --model " + exported_file("hf_dict_loss.pt") + " --data " + exported_file("blobs_split.pt") +
                         " --loss model --bs 32 --lr 1e-2 --threads 1 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(test::read_json(out + "/diagnosis.json")["verdict"], "healthy") << r.out;
}

TEST(ScriptedCliTest, AModelLossThatDoesNotFitIsAOneLineError) {
  const std::string more = " --data " + exported_file("blobs_split.pt") + " --loss model --threads 1 --out " + test::scratch_dir("own_loss_bad");
  expect_usage_error("train --model " + exported_file("labels_no_loss.pt") + more,
                     "--loss model does not fit: the model returns a dict with keys logits, with no loss");
  expect_usage_error("train --model " + exported_file("dict_out_plain.pt") + more,
                     "--loss model passes the targets as the model's last input, but its forward takes only (x)");
  expect_usage_error("doctor --model mlp --loss model --threads 1 --out " + test::scratch_dir("own_loss_builtin"),
                     "--loss model is for a TorchScript model that computes its loss; the built-in mlp does not");
}

TEST(ScriptedCliTest, BadModelsAndDataAreOneLineErrors) {
  const std::string out = " --bs 16 --threads 1 --force --out " + test::scratch_dir("byo_bad");
  const auto train = [&](const std::string& model, const std::string& data, const std::string& more = "") {
    return "train --model " + exported_file(model) + " --data " + exported_file(data) + more + out;
  };
  expect_usage_error(train("state_dict.pt", "stripes_data.pt"), "state_dict.pt is a torch.save'd file (a state_dict or a pickled module), not TorchScript");
  expect_usage_error(train("scripted_conv.pt", "no_y.pt"), "has no 'y' (it needs 'x' and 'y'");
  expect_usage_error(train("scripted_conv.pt", "short_y.pt"), "x has 768 samples but y has 100");
  expect_usage_error(train("scripted_conv.pt", "y_not_tensor.pt"), "'y' is a list, not a tensor");
  expect_usage_error(train("two_inputs.pt", "stripes_data.pt"), "forward takes 2 inputs (x, mask) but the data has 1");
  expect_usage_error(train("scripted_conv.pt", "two_inputs_data.pt"), "forward takes 1 input (x) but the data has 2");
  expect_usage_error(train("linear_20_32.pt", "regression_data.pt", " --loss mse"),
                     "the model's output [2, 32] does not fit the targets [2, 3] for mse");
  expect_usage_error(train("two_inputs.pt", "two_inputs_data.pt", " --loss mse"), "mse needs float targets");
  expect_usage_error(train("scripted_conv.pt", "float_targets.pt"), "cross_entropy needs integer class targets");
  expect_usage_error(train("int_param.pt", "regression_data.pt"), "parameter 'table' is Long");
  expect_usage_error("train --model nothere.pt" + out, "not a built-in model (cnn, mlp, resnet, transformer)");
  expect_usage_error(train("scripted_conv.pt", "stripes_data.pt", " --loss hinge"), "unknown --loss 'hinge'");
}

TEST(BuiltinCliTest, TheTransformerLearnsAndTheDoctorJudgesIt) {
  const std::string dir = test::scratch_dir("byo_transformer");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "to be or not to be, that is the question. ";
  std::ofstream(dir + "/text.txt") << text;
  const auto r = run_cli("train --model transformer --data " + dir + "/text.txt --epochs 2 --bs 8 --lr 1e-2 --threads 1 --force --out " +
                         dir + "/run");
  ASSERT_EQ(r.code, 0) << r.err;
  const double baseline = number_after(r.out, "unigram baseline perplexity ");
  const double ppl = number_after(r.out, "valid perplexity ");
  EXPECT_LT(ppl, baseline / 2) << r.out;  // a repeated sentence: context predicts it well
  const auto d = run_cli("doctor --model transformer --data " + dir + "/text.txt --bs 16 --lr 1e-2 --threads 1 --out " +
                         dir + "/doctor");
  EXPECT_NE(d.code, 2) << d.err;
  EXPECT_NE(d.out.find("verdict: "), std::string::npos) << d.out;
  // The resnet trains on Fashion-MNIST-shaped data and its model.pt loads back.
  const std::string fashion = test::fake_fashion_dir("byo_resnet", 64, 32);
  const auto res = run_cli("train --model resnet --data " + fashion + " --bs 16 --threads 1 --force --out " + dir + "/resnet");
  ASSERT_EQ(res.code, 0) << res.err;
  EXPECT_EQ(load_model(dir + "/resnet/model.pt").module().parameters().size(),
            run::build_builtin_model("resnet").module().parameters().size());
}

} // namespace
