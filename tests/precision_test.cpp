// Precision: the modes' names, their options' checks, and the one call that
// attaches the right callback (the one-liners are the same call).
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;

data::DataLoaders precision_loaders() {
  return data::DataLoaders::from_split({test::blobs(64, 3, 4, 1), test::blobs(32, 3, 4, 2)}, 16, 3);
}

TEST(PrecisionTest, NamesRoundTripAndUnknownNamesListTheChoices) {
  for (Precision p : all_precisions()) EXPECT_EQ(parse_precision(precision_name(p)), p);
  EXPECT_EQ(precision_name(Precision::kBf16Master), "bf16-master");
  EXPECT_THROW_WITH(parse_precision("fp8"),
                    "unsupported precision 'fp8' (available: fp32, fp16, bf16, fp16-master, bf16-master, bf16-pure)");
  EXPECT_TRUE(precision_scales_loss(Precision::kFp16));
  EXPECT_FALSE(precision_scales_loss(Precision::kBf16));
  EXPECT_TRUE(precision_scales_loss(Precision::kBf16Master));
  EXPECT_FALSE(precision_scales_loss(Precision::kBf16Pure));
  EXPECT_EQ(compute_dtype(Precision::kBf16Pure), torch::kBFloat16);
  EXPECT_FALSE(uses_master_weights(Precision::kBf16Pure));
}

TEST(PrecisionTest, OptionsAreValidatedForTheModeThatUsesThem) {
  const torch::Device cpu(torch::kCPU);
  const auto bad_scaler = PrecisionOptions().scaler(amp::GradScalerOptions().growth_factor(1));
  EXPECT_THROW_WITH(validate_precision(Precision::kFp16, bad_scaler, cpu), "Invalid growth_factor: 1");
  EXPECT_NO_THROW(validate_precision(Precision::kBf16, bad_scaler, cpu));  // bf16 has no scaler
  const auto bad_master = PrecisionOptions().master(amp::MasterWeightsOptions().max_noskip(0));
  EXPECT_THROW_WITH(validate_precision(Precision::kBf16Master, bad_master, cpu), "Invalid max_noskip: 0");
  EXPECT_NO_THROW(validate_precision(Precision::kFp16, bad_master, cpu));
  EXPECT_THROW_WITH(validate_precision(Precision::kFp16Master, PrecisionOptions(), cpu),
                    "precision fp16-master needs CUDA");
}

TEST(PrecisionTest, SetPrecisionAttachesOneCallbackThatSaysWhatItDoes) {
  Learner learn(torch::nn::Linear(4, 3), precision_loaders(), cross_entropy(), LearnerOptions().progress(false));
  EXPECT_EQ(learn.precision(), Precision::kFp32);
  EXPECT_EQ(learn.precision_cb(), nullptr);

  learn.set_precision(Precision::kFp16, PrecisionOptions().scaler(amp::GradScalerOptions().init_scale(512)));
  auto pc = learn.precision_cb();
  ASSERT_NE(pc, nullptr);
  EXPECT_EQ(learn.precision(), Precision::kFp16);
  EXPECT_EQ(pc->dtype(), torch::kHalf);
  EXPECT_TRUE(pc->loss_scaled());
  EXPECT_EQ(pc->loss_scale(), 512);
  EXPECT_NE(pc->grad_scaler(), nullptr);
  // The end-of-fit warning is diagnose's: whoever wants it attaches it (the run layer does for fp16).
  EXPECT_EQ(learn.get_cb<diagnose::FitWarning>(), nullptr);

  learn.set_precision(Precision::kBf16);
  int precision_callbacks = 0;
  for (const auto& cb : learn.cbs()) precision_callbacks += std::dynamic_pointer_cast<PrecisionCallback>(cb) != nullptr;
  EXPECT_EQ(precision_callbacks, 1);  // replaced, not added
  EXPECT_EQ(learn.get_cb<diagnose::FitWarning>(), nullptr);
  EXPECT_EQ(learn.precision_cb()->dtype(), torch::kBFloat16);
  EXPECT_FALSE(learn.precision_cb()->loss_scaled());
  EXPECT_EQ(learn.precision_cb()->loss_scale(), 1);

  learn.set_precision(Precision::kBf16Master, PrecisionOptions().master(amp::MasterWeightsOptions().loss_scale(64)));
  EXPECT_EQ(learn.precision(), Precision::kBf16Master);
  EXPECT_EQ(learn.precision_cb()->dtype(), torch::kBFloat16);
  EXPECT_EQ(learn.precision_cb()->loss_scale(), 64);
  EXPECT_EQ(learn.model().module().parameters()[0].scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(learn.precision_cb()->param_memory().has_value());

  learn.set_precision(Precision::kFp32);
  EXPECT_EQ(learn.precision_cb(), nullptr);
  EXPECT_EQ(learn.model().module().parameters()[0].scalar_type(), torch::kFloat);  // masters copied back
}

TEST(PrecisionTest, OneLinersAreTheSameCall) {
  Learner learn(torch::nn::Linear(4, 3), precision_loaders(), cross_entropy(), LearnerOptions().progress(false));
  learn.to_fp16(amp::GradScalerOptions().init_scale(128));
  EXPECT_EQ(learn.precision(), Precision::kFp16);
  EXPECT_EQ(learn.precision_cb()->loss_scale(), 128);
  learn.to_bf16();
  EXPECT_EQ(learn.precision(), Precision::kBf16);
  learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16));
  EXPECT_EQ(learn.precision(), Precision::kBf16Master);
  learn.to_fp32();
  EXPECT_EQ(learn.precision(), Precision::kFp32);
  // A refused mode leaves the Learner as it was.
  learn.to_bf16();
  EXPECT_THROW(learn.to_half(), c10::Error);  // fp16 master weights on a CPU
  EXPECT_EQ(learn.precision(), Precision::kBf16);
}

TEST(PrecisionTest, RunConfigRoundTripsThroughOneFieldTable) {
  RunConfig c;
  c.model = "mlp";
  c.seed = 9223372036854775807ull;  // the largest seed (2^63-1) survives as an integer, digit for digit
  c.precision = Precision::kBf16Master;
  c.precision_options.scaler().init_scale(1024).growth_interval(7);
  c.precision_options.master().loss_scale(32).dynamic(false).flat_master(true);
  c.precision_options.allow_fp16_emulation(false);
  c.clip = 0.5;
  const std::string json = c.to_json();
  EXPECT_NE(json.find("\"seed\": 9223372036854775807"), std::string::npos) << json;
  const RunConfig back = RunConfig::from_json(json);
  EXPECT_EQ(back.to_json(), json);
  EXPECT_EQ(back.precision, Precision::kBf16Master);
  EXPECT_EQ(back.precision_options.scaler().growth_interval(), 7);
  EXPECT_FALSE(back.precision_options.master().dynamic());
  EXPECT_FALSE(back.precision_options.allow_fp16_emulation());
  EXPECT_THROW_WITH(RunConfig::from_json("{\"data\": \"x\"}"), "field 'model' is missing");
  EXPECT_THROW_WITH(RunConfig::from_json(json.substr(0, json.size() / 2)), "not valid JSON");
  std::string wrong = json;
  wrong.replace(wrong.find("\"epochs\": 1"), 11, "\"epochs\": \"one\"");
  EXPECT_THROW_WITH(RunConfig::from_json(wrong), "field 'epochs' has the wrong type");
}

// The precision table is where a mode is described: the help texts, the C++ call the
// doctor prints, which modes the doctor traces overflow in, and the CPU's refusal are
// all read from it.
TEST(PrecisionTest, TheTableSaysEachModesHelpItsCallItsTracingAndItsCpuRefusal) {
  const run::Option* precision = run::find_option("precision");
  ASSERT_NE(precision, nullptr);
  for (const auto& m : precision_modes()) {
    // util's phrase names the call without seeing the table: the two must agree.
    EXPECT_EQ(api_words().setting("precision", m.name), m.api_call) << m.name;
    EXPECT_NE(precision->help_in(run::Command::kTrain).find(std::string(m.name) + " (" + m.summary + ")"), std::string::npos)
        << m.name;
    EXPECT_NE(precision->help_in(run::Command::kLrFind).find(m.name), std::string::npos) << m.name;
    if (!m.cpu_refusal) EXPECT_NO_THROW(check_mode_runs_on(m.precision, /*device_is_cpu=*/true)) << m.name;
    EXPECT_NO_THROW(check_mode_runs_on(m.precision, /*device_is_cpu=*/false)) << m.name;
  }
  EXPECT_EQ(precision->help_in(run::Command::kDoctor), "The precision compared with fp32: fp16 (default), bf16 or bf16-pure");
  EXPECT_THROW_WITH(check_mode_runs_on(Precision::kFp16Master, true),
                    "precision fp16-master needs CUDA (libtorch has no CPU half matmul); use "
                    "to_half(MasterWeightsOptions().dtype(kBFloat16)), or to_fp16() (emulated on CPU)");
  // fp16 compute is traced from scratch and from a run's checkpoint alike (fp16-master is
  // replayed only from a checkpoint, on CUDA); fp16's GradScaler is fp16's alone.
  EXPECT_EQ(modes_where(&PrecisionMode::traces_overflow), (std::vector<Precision>{Precision::kFp16, Precision::kFp16Master}));
  EXPECT_EQ(modes_where(&PrecisionMode::grad_scaler), std::vector<Precision>{Precision::kFp16});
  EXPECT_EQ(modes_where(&PrecisionMode::autocast), (std::vector<Precision>{Precision::kFp16, Precision::kBf16}));
  EXPECT_EQ(mode_names(modes_where(&PrecisionMode::doctor_compares)), "fp16, bf16 or bf16-pure");
}

} // namespace
