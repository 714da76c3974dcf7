// The stored-model rule (run/stored_model.h): what a bf16 or fp16 model asks for, said
// once for Python and the CLI.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;
using c10::ScalarType;

struct StoredNormMlp : torch::nn::Module {
  StoredNormMlp() {
    fc = register_module("fc", torch::nn::Linear(4, 8));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    head = register_module("head", torch::nn::Linear(8, 2));
  }
  torch::nn::Linear fc{nullptr}, head{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

TEST(StoredModelTest, ReadsWholeSixteenBitModelsAndHuggingFacesFp32ModulesAndNothingElse) {
  auto model = std::make_shared<StoredNormMlp>();
  EXPECT_FALSE(run::stored_model(*model).sixteen_bit);  // fp32: nothing to say
  EXPECT_FALSE(run::stored_model(*model).holds_bf16());
  model->to(torch::kBFloat16);
  EXPECT_EQ(run::stored_model(*model).sixteen_bit, ScalarType::BFloat16);
  model->norm->to(torch::kFloat);  // Hugging Face's _keep_in_fp32_modules shape
  auto stored = run::stored_model(*model);
  EXPECT_FALSE(stored.sixteen_bit);
  EXPECT_EQ(stored.fp32_modules, std::vector<std::string>{"norm"});
  EXPECT_TRUE(stored.holds_bf16());
  // An fp32 parameter beside a bf16 one in one module is a mix, not an island.
  model->fc->bias.set_data(model->fc->bias.to(torch::kFloat));
  EXPECT_TRUE(run::stored_model(*model).fp32_modules.empty());
  EXPECT_FALSE(run::stored_model(*model).holds_bf16());
  model->to(torch::kHalf);
  EXPECT_EQ(run::stored_model(*model).sixteen_bit, ScalarType::Half);
  // Read by name as Python passes it.
  stored = run::stored_model({{"", {}}, {"a", {ScalarType::BFloat16}}, {"a.ln", {ScalarType::Float, ScalarType::Float}}});
  EXPECT_EQ(stored.fp32_modules, std::vector<std::string>{"a.ln"});
}

TEST(StoredModelTest, ABf16ModelIsBf16PureUnlessChosenAndAnFp16ModelIsOneLine) {
  run::StoredModel whole;
  whole.sixteen_bit = ScalarType::BFloat16;
  auto c = run::choose_for_stored_model(whole, false, false, false, false);
  EXPECT_EQ(c.precision, Precision::kBf16Pure);
  EXPECT_FALSE(c.keep_fp32);
  EXPECT_EQ(c.notice.str(run::flag_words()),
            "the model's parameters are bf16: training it as bf16-pure (bf16 weights, gradients and optimizer state, no "
            "fp32 copy); set --precision to choose another mode");
  EXPECT_NE(run::choose_for_stored_model(whole, false, false, false, true).notice.str(run::keyword_words()).find("diagnosing it as bf16-pure"),
            std::string::npos);
  // The caller's choice, or a branch keeping its run's mode: nothing is chosen or said.
  for (const auto& [given, branch] : {std::pair<bool, bool>{true, false}, {false, true}}) {
    c = run::choose_for_stored_model(whole, given, false, branch, false);
    EXPECT_FALSE(c.precision);
    EXPECT_TRUE(c.notice.empty());
  }
  run::StoredModel islands;
  islands.fp32_modules = {"blocks.0.ln", "blocks.1.ln"};
  c = run::choose_for_stored_model(islands, false, false, false, false);
  EXPECT_EQ(c.precision, Precision::kBf16Pure);
  EXPECT_EQ(c.keep_fp32, "blocks.0.ln,blocks.1.ln");
  EXPECT_NE(c.notice.str(run::keyword_words()).find("bf16 except 2 modules kept in fp32 (blocks.0.ln, blocks.1.ln)"),
            std::string::npos);
  EXPECT_NE(c.notice.str(run::keyword_words()).find("with keep_fp32=[\"blocks.0.ln\", \"blocks.1.ln\"]"), std::string::npos)
      << c.notice.str(run::keyword_words());
  c = run::choose_for_stored_model(islands, false, /*keep_fp32_given=*/true, false, false);
  EXPECT_FALSE(c.keep_fp32);  // the caller's islands stand
  EXPECT_EQ(c.notice.str(run::keyword_words()).find("with keep_fp32"), std::string::npos);
  run::StoredModel half;
  half.sixteen_bit = ScalarType::Half;
  for (bool given : {false, true})
    EXPECT_THROW_WITH(run::choose_for_stored_model(half, given, false, false, false),
                      "the model's parameters are fp16, which mixtrain does not train without an fp32 copy");
  EXPECT_TRUE(run::choose_for_stored_model(run::StoredModel(), false, false, false, false).notice.empty());
}

TEST(StoredModelTest, Bf16WeightsAreWidenedExactlyAndOtherModelsAreLeftAsTheyAre) {
  auto model = std::make_shared<StoredNormMlp>();
  EXPECT_FALSE(run::widen_bf16_storage(*model));
  model->to(torch::kBFloat16);
  const torch::Tensor before = model->fc->weight.clone();
  EXPECT_TRUE(run::widen_bf16_storage(*model));
  EXPECT_EQ(model->fc->weight.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(model->fc->weight, before.to(torch::kFloat)));
}

// What libtorch would report deep inside a run is one line first, in both front ends' words.
TEST(StoredModelTest, AModelOnTheMetaDeviceAllFrozenOrInFloat64IsOneLine) {
  auto model = std::make_shared<StoredNormMlp>();
  EXPECT_NO_THROW(run::refuse_untrainable(*model));
  model->fc->weight.requires_grad_(false);  // some frozen: fine
  EXPECT_NO_THROW(run::refuse_untrainable(*model));
  for (auto& p : model->parameters()) p.requires_grad_(false);
  EXPECT_THROW_WITH(run::refuse_untrainable(*model), "every parameter of the model is frozen (requires_grad=False)");
  for (auto& p : model->parameters()) p.requires_grad_(true);
  model->norm->to(torch::kDouble);  // one float64 module is enough to fail deep inside
  EXPECT_THROW_WITH(run::refuse_untrainable(*model), "the model's parameters are float64");
  torch::nn::Module on_meta;  // a model built on the meta device (libtorch's to(kMeta) refuses set_data)
  on_meta.register_parameter("weight", torch::empty({4, 4}, torch::device(torch::kMeta)));
  EXPECT_THROW_WITH(run::refuse_untrainable(on_meta), "the model's parameters are on the meta device");
  EXPECT_NO_THROW(run::refuse_untrainable(std::vector<torch::Tensor>{}));  // no parameters: nothing to refuse
  try {
    run::refuse_untrainable(std::vector<torch::Tensor>{torch::zeros({2}, torch::kDouble).requires_grad_()});
    FAIL() << "float64 was not refused";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.key(), "model");  // each front end names it in its words
  }
}

} // namespace
