// The option table: every RunConfig field has its row, args.json round-trips
// through it, older files read with defaults, and each front end's words.
#include "test_util.h"

#include <mixtrain/util/option_error.h>
#include <mixtrain/run/options.h>
#include <mixtrain/run/run_folder.h>

#include <nlohmann/json.hpp>

#include <set>

namespace {

using namespace mixtrain;
using namespace mixtrain::run;

/// A non-default value for each RunConfig field, by its table key, and whether it arrived.
struct FieldProbe {
  const char* key;
  const char* value;
  std::function<bool(const RunConfig&)> arrived;
};

TEST(RunOptionsTest, EveryRunConfigFieldHasARowAndRoundTrips) {
  RunConfig c;
  // Adding a field to RunConfig stops this line compiling until the field is
  // named here, probed below and given a row in the option table.
  [[maybe_unused]] auto& [data, model, loss, output, epochs, lr, bs, seed, limit, threads, thread_policy, precision,
                          precision_options, clip, accum, wd_bn_bias, opt, save_every, save_every_steps, keep, max_bad_steps, comm_dtype, ranks,
                          monitor, save_best, early_stop, split_at, freeze_to] = c;
  RunArgs args;
  const std::vector<FieldProbe> probes = {
      {"data", "d.pt", [](const RunConfig& r) { return r.data == "d.pt"; }},
      {"model", "mlp", [](const RunConfig& r) { return r.model == "mlp"; }},
      {"loss", "mse", [](const RunConfig& r) { return r.loss == LossKind::kMse; }},
      {"output", "logits", [](const RunConfig& r) { return r.output == "logits"; }},
      {"epochs", "3", [](const RunConfig& r) { return r.epochs == 3; }},
      {"lr", "1e-4,1e-3", [](const RunConfig& r) { return r.lr == Lrs(std::vector<double>{1e-4, 1e-3}); }},
      {"bs", "32", [](const RunConfig& r) { return r.bs == 32; }},
      {"seed", "9223372036854775807", [](const RunConfig& r) { return r.seed == 9223372036854775807ull; }},
      {"limit", "100", [](const RunConfig& r) { return r.limit == 100; }},
      {"threads", "2", [](const RunConfig& r) { return r.threads == 2; }},
      {"thread_policy", "blas", [](const RunConfig& r) { return r.thread_policy == ThreadPolicy::kBlas; }},
      {"precision", "bf16-master", [](const RunConfig& r) { return r.precision == Precision::kBf16Master; }},
      {"init_scale", "1024", [](const RunConfig& r) { return r.precision_options.scaler().init_scale() == 1024; }},
      {"growth_factor", "3", [](const RunConfig& r) { return r.precision_options.scaler().growth_factor() == 3; }},
      {"backoff_factor", "0.25", [](const RunConfig& r) { return r.precision_options.scaler().backoff_factor() == 0.25; }},
      {"growth_interval", "7", [](const RunConfig& r) { return r.precision_options.scaler().growth_interval() == 7; }},
      {"no_emulation", "true", [](const RunConfig& r) { return !r.precision_options.allow_fp16_emulation(); }},
      {"dynamic", "false", [](const RunConfig& r) { return !r.precision_options.master().dynamic(); }},
      {"loss_scale", "32", [](const RunConfig& r) { return r.precision_options.master().loss_scale() == 32; }},
      {"max_noskip", "9", [](const RunConfig& r) { return r.precision_options.master().max_noskip() == 9; }},
      {"max_scale", "4096", [](const RunConfig& r) { return r.precision_options.master().max_scale() == 4096; }},
      {"flat_master", "true", [](const RunConfig& r) { return r.precision_options.master().flat_master(); }},
      {"clip", "0.5", [](const RunConfig& r) { return r.clip == 0.5; }},
      {"accum", "2", [](const RunConfig& r) { return r.accum == 2; }},
      {"wd_bn_bias", "true", [](const RunConfig& r) { return r.wd_bn_bias; }},
      {"opt", "rmsprop", [](const RunConfig& r) { return r.opt.kind() == OptimizerKind::kRmsprop; }},
      {"mom", "0.5", [](const RunConfig& r) { return r.opt.mom() == 0.5; }},
      {"sqr_mom", "0.9", [](const RunConfig& r) { return r.opt.sqr_mom() == 0.9; }},
      {"eps", "0.001", [](const RunConfig& r) { return r.opt.eps() == 1e-3; }},
      {"wd", "0.25", [](const RunConfig& r) { return r.opt.wd() == 0.25; }},
      {"save_every", "1", [](const RunConfig& r) { return r.save_every == 1; }},
      {"save_every_steps", "7", [](const RunConfig& r) { return r.save_every_steps == 7; }},
      {"keep_fp32", "conv_proj,encoder.layers.*.mlp",
       [](const RunConfig& r) { return r.precision_options.keep_fp32() == std::vector<std::string>{"conv_proj", "encoder.layers.*.mlp"}; }},
      {"keep", "2", [](const RunConfig& r) { return r.keep == 2; }},
      {"weight_update", "kahan",
       [](const RunConfig& r) { return r.precision_options.weight_update() == amp::WeightUpdate::kKahan; }},
      {"max_bad_steps", "3", [](const RunConfig& r) { return r.max_bad_steps == 3; }},
      {"comm_dtype", "fp16", [](const RunConfig& r) { return r.comm_dtype == c10::ScalarType::Half; }},
      {"ranks", "4", [](const RunConfig& r) { return r.ranks == 4; }},
      {"monitor", "accuracy", [](const RunConfig& r) { return r.monitor == "accuracy"; }},
      {"save_best", "true", [](const RunConfig& r) { return r.save_best; }},
      {"early_stop", "5", [](const RunConfig& r) { return r.early_stop == 5; }},
      {"split_at", "3,7", [](const RunConfig& r) { return r.split_at == "3,7"; }},
      {"freeze_to", "1", [](const RunConfig& r) { return r.freeze_to == 1; }},
  };
  std::set<std::string> probed;
  for (const auto& p : probes) {
    SCOPED_TRACE(p.key);
    const Option* o = find_option(p.key);
    ASSERT_NE(o, nullptr) << "no table row for RunConfig's " << p.key;
    EXPECT_TRUE(o->stored) << p.key << " is not kept in args.json";
    EXPECT_FALSE(p.arrived(c)) << "the probe value is the default";
    args.config = c;
    o->set(args, p.value);
    c = args.config;
    EXPECT_TRUE(p.arrived(c)) << "setting " << p.key << " did not reach its RunConfig field";
    probed.insert(p.key);
  }
  // And the other way: every stored row of the table is probed here.
  for (const auto& o : options())
    if (o.stored) EXPECT_TRUE(probed.count(o.key)) << "table row " << o.key << " is not probed";
  const std::string json = c.to_json();
  const RunConfig back = RunConfig::from_json(json);
  EXPECT_EQ(back.to_json(), json);
  for (const auto& p : probes) EXPECT_TRUE(p.arrived(back)) << p.key << " did not survive args.json";
}

TEST(RunOptionsTest, OlderArgsJsonReadsWithDefaultsAndBadFieldsAreNamed) {
  // A first-release args.json: every field added since is absent.
  nlohmann::json j = nlohmann::json::parse(RunConfig().to_json());
  int dropped = 0;
  for (const auto& o : options())
    if (o.added_later) dropped += static_cast<int>(j.erase(o.key));
  for (const char* later : {"loss", "wd_bn_bias", "monitor", "save_best", "early_stop", "split_at", "freeze_to", "ranks"})
    EXPECT_EQ(find_option(later)->added_later, true) << later;
  EXPECT_GE(dropped, 9);
  const RunConfig older = RunConfig::from_json(j.dump());
  EXPECT_EQ(older.to_json(), RunConfig().to_json());

  EXPECT_THROW_WITH(RunConfig::from_json("{\"data\": \"x\"}"), "field 'model' is missing");
  nlohmann::json unknown = j;
  unknown["colour"] = "blue";
  EXPECT_THROW_WITH(RunConfig::from_json(unknown.dump()), "unknown field 'colour'");
  nlohmann::json wrong = j;
  wrong["epochs"] = "one";
  EXPECT_THROW_WITH(RunConfig::from_json(wrong.dump()), "field 'epochs' has the wrong type (expected an integer, got \"one\")");
  wrong["epochs"] = 1;
  wrong["precision"] = "fp8";
  EXPECT_THROW_WITH(RunConfig::from_json(wrong.dump()), "field 'precision': unsupported precision 'fp8'");

  // Only a file that is not JSON is "damaged".
  const std::string dir = test::scratch_dir("run_options_read");
  test::write_raw(dir + "/args.json", {'{', '"'});
  EXPECT_THROW_WITH(RunConfig::read(dir), "args.json is damaged: not valid JSON");
  std::ofstream(dir + "/args.json") << unknown.dump();
  try {
    RunConfig::read(dir);
    ADD_FAILURE() << "an unknown field was accepted";
  } catch (const c10::Error& e) {
    EXPECT_EQ(e.msg().find("damaged"), std::string::npos) << e.msg();
    EXPECT_NE(e.msg().find("unknown field 'colour'"), std::string::npos) << e.msg();
  }
}

TEST(RunOptionsTest, ErrorsCarryTheKeyAndEachFrontEndNamesItInItsWords) {
  RunArgs args = defaults_for(Command::kTrain);
  args.config.precision = Precision::kFp16;
  args.config.precision_options.scaler().growth_factor(1);
  try {
    validate(args, Command::kTrain);
    ADD_FAILURE() << "growth_factor 1 was accepted";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.key(), "growth_factor");
    EXPECT_NE(std::string(e.what()).find("Invalid growth_factor: 1 (must be > 1)"), std::string::npos);
    EXPECT_EQ(e.message(flag_words()), "invalid --growth-factor 1: must be > 1");
    EXPECT_EQ(e.message(keyword_words()), "invalid growth_factor=1: must be > 1");  // as Python writes the call
  }
  const Phrase fix = "start the scaler lower: " + Phrase::setting("init_scale", "256") + ", or " +
                     Phrase::setting("precision", "bf16") + " without " + Phrase::name("no_emulation");
  EXPECT_EQ(fix.str(), "start the scaler lower: GradScalerOptions().init_scale(256), or to_bf16() without allow_fp16_emulation");
  EXPECT_EQ(fix.str(flag_words()), "start the scaler lower: --init-scale 256, or --precision bf16 without --no-emulation");
  EXPECT_EQ(fix.str(keyword_words()), "start the scaler lower: init_scale=256, or precision=\"bf16\" without no_emulation");
  EXPECT_EQ(fix.keys(), (std::vector<std::string>{"init_scale", "precision", "no_emulation"}));
  const Phrase island = Phrase::setting("keep_fp32", "conv_proj,encoder.*.mlp");
  EXPECT_EQ(island.str(flag_words()), "--keep-fp32 conv_proj,encoder.*.mlp");
  EXPECT_EQ(island.str(keyword_words()), "keep_fp32=[\"conv_proj\", \"encoder.*.mlp\"]");
  EXPECT_EQ(island.str(), "PrecisionOptions().keep_fp32({\"conv_proj\", \"encoder.*.mlp\"})");

  // Each check names its own key.
  const std::vector<std::pair<std::function<void(RunArgs&)>, std::string>> bad = {
      {[](RunArgs& a) { a.config.bs = 0; }, "bs"},
      {[](RunArgs& a) { a.config.model = "vgg"; }, "model"},
      {[](RunArgs& a) { find_option("loss")->set(a, "hinge"); }, "loss"},  // a choice is refused as it is set
      {[](RunArgs& a) { find_option("thread_policy")->set(a, "gpu"); }, "thread_policy"},
      {[](RunArgs& a) { find_option("comm_dtype")->set(a, "int8"); }, "comm_dtype"},
      {[](RunArgs& a) { a.config.precision = Precision::kFp16; a.config.precision_options.scaler().growth_factor(INFINITY); }, "growth_factor"},
      {[](RunArgs& a) { a.timeout = NAN; }, "timeout"},
      {[](RunArgs& a) { a.config.freeze_to = 1; }, "freeze_to"},
      {[](RunArgs& a) { a.config.data = "/nonexistent"; }, "data"},
      {[](RunArgs& a) { a.config.precision = Precision::kFp16Master; }, "precision"},
  };
  for (const auto& [spoil, key] : bad) {
    RunArgs a = defaults_for(Command::kTrain);
    try {
      spoil(a);
      validate(a, Command::kTrain);
      ADD_FAILURE() << key << " was accepted";
    } catch (const OptionError& e) {
      EXPECT_EQ(e.key(), key) << e.what();
    }
  }
}

// Scales, factors, clip norms and learning rates become fp32 tensors: a number
// past fp32's range (or not finite) is refused by validate, before any folder
// exists, for every numeric option of the table.
TEST(RunOptionsTest, EveryNumberIsFiniteAndWithinFp32Range) {
  int checked = 0;
  for (const Option& o : options()) {
    if (o.type != ValueType::kNumber || !o.takes(Command::kTrain)) continue;
    for (const std::string bad : {"1e39", "-1e39", "inf", "nan"}) {
      SCOPED_TRACE(o.key + " " + bad);
      RunArgs a = defaults_for(Command::kTrain);
      if (!o.modes.empty()) a.config.precision = o.modes.front();
      try {
        o.set(a, bad);
        validate(a, Command::kTrain);
        ADD_FAILURE() << "accepted";
      } catch (const OptionError& e) {
        EXPECT_EQ(e.key(), o.key) << e.what();
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 6);
  for (const std::string lr : {"1e300", "1e-3,1e39", "1e-5:1e300"}) {
    SCOPED_TRACE(lr);
    RunArgs a = defaults_for(Command::kTrain);
    EXPECT_THROW_WITH(find_option("lr")->set(a, lr), "must be at most 3.4e38");
  }
}

TEST(RunOptionsTest, CommandsTakeTheirOwnOptionsAndWarnAboutOnesThatDoNothing) {
  for (const char* train_only : {"resume", "save_best", "split_at", "comm_dtype", "epochs", "lr"})
    EXPECT_FALSE(find_option(train_only)->takes(Command::kLrFind)) << train_only;
  for (const char* lr_find_only : {"start_lr", "end_lr", "num_it"}) {
    EXPECT_TRUE(find_option(lr_find_only)->takes(Command::kLrFind));
    EXPECT_FALSE(find_option(lr_find_only)->takes(Command::kTrain));
  }
  EXPECT_EQ(defaults_for(Command::kDoctor).config.precision, Precision::kFp16);
  EXPECT_NE(find_option("out")->help_in(Command::kLrFind).find("lr_find.svg"), std::string::npos);
  RunArgs a;
  a.config.precision = Precision::kBf16;
  a.config.threads = 64;
  const auto warnings = ignored_option_warnings(a, {"init_scale", "bs", "loss_scale"}, 2);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_EQ(warnings[0].str(flag_words()), "--init-scale does nothing with --precision bf16 (it sets fp16's GradScaler)");
  EXPECT_EQ(warnings[1].str(flag_words()), "--loss-scale does nothing with --precision bf16 (it sets fp16-master/bf16-master)");
  EXPECT_NE(warnings[2].str(flag_words()).find("--threads 64 is more than the 2 CPU(s) this process may use"), std::string::npos);
  EXPECT_EQ(format_number(10), "10");
  EXPECT_EQ(format_number(0.1), "0.1");
  EXPECT_EQ(format_number(16777216), "16777216");
  EXPECT_EQ(std::strtod(format_number(1.0 / 3).c_str(), nullptr), 1.0 / 3);
}

} // namespace
