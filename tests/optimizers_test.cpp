// The five optimizers known in one place (core/optimizers.h), and --opt with its knobs
// in every mode, the doctor and args.json.
#include "cli_util.h"
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace mixtrain {
namespace {

std::vector<torch::Tensor> one_param() { return {torch::zeros({4}, torch::requires_grad())}; }

TEST(OptimizersTest, FastaisDefaultsForEachKind) {
  const auto adamw = OptimizerSettings().resolved();
  EXPECT_EQ(adamw.kind(), OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(adamw.mom(), 0.9);
  EXPECT_DOUBLE_EQ(adamw.sqr_mom(), 0.99);
  EXPECT_DOUBLE_EQ(adamw.eps(), 1e-5);
  EXPECT_DOUBLE_EQ(adamw.wd(), 0.01);
  const auto sgd = OptimizerSettings().kind(OptimizerKind::kSgd).resolved();
  EXPECT_DOUBLE_EQ(sgd.mom(), 0.0);
  EXPECT_DOUBLE_EQ(sgd.wd(), 0.0);
  EXPECT_DOUBLE_EQ(OptimizerSettings().kind(OptimizerKind::kRmsprop).resolved().eps(), 1e-8);
  EXPECT_DOUBLE_EQ(OptimizerSettings().kind(OptimizerKind::kAdagrad).resolved().eps(), 1e-10);
  // A value given is kept.
  EXPECT_DOUBLE_EQ(OptimizerSettings().kind(OptimizerKind::kSgd).mom(0.5).resolved().mom(), 0.5);
  for (OptimizerKind k : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd, OptimizerKind::kRmsprop,
                          OptimizerKind::kAdagrad}) {
    EXPECT_EQ(parse_optimizer(optimizer_name(k)), k);
    const auto opt = optimizer(OptimizerSettings().kind(k))(one_param(), 1e-3);
    EXPECT_EQ(kind_of(*opt), k) << optimizer_name(k);
  }
  EXPECT_EQ(parse_optimizer("lion"), std::nullopt);
}

// What bytes per parameter count: the state each optimizer keeps with its options
// (Adam's amsgrad and RMSprop's momentum were undercounted by a fixed table).
TEST(OptimizersTest, StateTensorsPerParamFollowTheOptions) {
  namespace optim = torch::optim;
  const auto count = [](std::unique_ptr<optim::Optimizer> o) { return *state_tensors_per_param(*o); };
  EXPECT_EQ(count(std::make_unique<optim::AdamW>(one_param(), optim::AdamWOptions())), 2);
  EXPECT_EQ(count(std::make_unique<optim::Adam>(one_param(), optim::AdamOptions().amsgrad(true))), 3);
  EXPECT_EQ(count(std::make_unique<optim::SGD>(one_param(), optim::SGDOptions(0.1))), 0);
  EXPECT_EQ(count(std::make_unique<optim::SGD>(one_param(), optim::SGDOptions(0.1).momentum(0.9))), 1);
  EXPECT_EQ(count(std::make_unique<optim::RMSprop>(one_param(), optim::RMSpropOptions())), 1);
  EXPECT_EQ(count(std::make_unique<optim::RMSprop>(one_param(), optim::RMSpropOptions().momentum(0.9).centered(true))), 3);
  EXPECT_EQ(count(std::make_unique<optim::Adagrad>(one_param(), optim::AdagradOptions())), 1);
  // Each counted tensor is one the optimizer keeps after a step.
  auto p = one_param();
  optim::RMSprop rms(p, optim::RMSpropOptions().momentum(0.9).centered(true));
  p[0].mutable_grad() = torch::ones({4});
  rms.step();
  int64_t kept = 0;
  for (auto& kv : rms.state()) {
    const auto tensors = state_tensors(*kv.second);  // held: a range-for would not keep the temporary alive
    ASSERT_TRUE(tensors);
    for (const torch::Tensor* t : *tensors) kept += t->defined() && t->numel() > 0;
  }
  EXPECT_EQ(kept, 3);
}

TEST(OptimizersCliTest, EveryOptimizerTrainsInEveryModeAndArgsJsonKeepsItsSettings) {
  const std::string dir = test::fake_fashion_dir("cli_opt", 256, 64);
  const std::string out = test::scratch_dir("cli_opt_out");
  int i = 0;
  for (const std::string opt : {"adam", "sgd", "rmsprop", "adagrad"})
    for (const std::string precision : {"fp16", "bf16-pure", "bf16-master"}) {
      const std::string run = out + "/" + std::to_string(i++);
      const test::CliResult r = test::run_cli("train --data " + dir + " --model mlp --bs 32 --threads 1 --lr 1e-3 --opt " + opt +
                                              " --precision " + precision + " --out " + run);
      ASSERT_EQ(r.code, 0) << opt << " " << precision << ": " << r.err;
      const auto args = test::read_json(run + "/args.json");
      EXPECT_EQ(args.at("opt"), opt);
      EXPECT_TRUE(std::isfinite(test::read_json(run + "/summary.json").at("valid_loss").get<double>())) << opt << " " << precision;
    }
  const test::CliResult sgd = test::run_cli("train --data " + dir + " --model mlp --bs 32 --threads 1 --opt sgd --mom 0.8 --wd 1e-4 "
                                            "--epochs 2 --interrupt-at-step 3 --out " + out + "/sgd");
  ASSERT_EQ(sgd.code, 130) << sgd.err;
  const auto args = test::read_json(out + "/sgd/args.json");
  EXPECT_EQ(args.at("mom"), 0.8);
  EXPECT_EQ(args.at("wd"), 1e-4);
  EXPECT_EQ(args.at("eps"), 1e-10);  // sgd has no epsilon: the resolved default is kept as written
  // The run resumes with the same optimizer: args.json is what it reads, and the
  // checkpoint's SGD state loads into it (another optimizer's would not).
  const test::CliResult again = test::run_cli("train --resume " + out + "/sgd");
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(test::read_json(out + "/sgd/args.json").at("mom"), 0.8);
  test::expect_usage_error("train --data " + dir + " --model mlp --opt lion --out " + out + "/bad",
                           "unknown --opt 'lion' (choices: adamw, adam, sgd, rmsprop, adagrad)");
  test::expect_usage_error("train --data " + dir + " --model mlp --opt sgd --mom 1 --out " + out + "/bad",
                           "invalid --mom 1: must be >= 0 and < 1");
  test::expect_usage_error("train --data " + dir + " --model mlp --eps 0 --out " + out + "/bad", "invalid --eps 0: must be > 0");
}

TEST(OptimizersCliTest, TheDoctorTakesTheOptimizer) {
  const std::string dir = test::fake_fashion_dir("cli_opt_doctor", 256, 64);
  const std::string out = test::scratch_dir("cli_opt_doctor_out");
  const test::CliResult r = test::run_cli("doctor --data " + dir + " --model mlp --bs 32 --threads 1 --epochs 1 --opt sgd --mom 0.9 "
                                          "--lr 0.05 --precision bf16-pure --no-trials --out " + out);
  ASSERT_LE(r.code, 1) << r.err;
  const auto d = test::read_json(out + "/diagnosis.json");
  // SGD with momentum keeps one state tensor: bf16 weight, gradient and buffer.
  EXPECT_EQ(d.at("evidence").at("mixed").at("bytes_per_param"), 6) << d.at("evidence").at("mixed");
  EXPECT_EQ(d.at("evidence").at("fp32").at("bytes_per_param"), 12) << d.at("evidence").at("fp32");
}

} // namespace
} // namespace mixtrain
