// Parameter groups: the splitter, fastai's lr slices, discriminative learning
// rates through the one-cycle schedule, freeze/unfreeze (frozen groups bitwise
// unchanged, optimizer state included, in every precision mode), checkpoints
// and the CLI's --split-at / --freeze-to / --lr lists.
#include "cli_util.h"
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <cmath>
#include <unordered_set>

namespace {

using namespace mixtrain;
using test::CliResult;
using test::expect_usage_error;
using test::run_cli;
using test::slurp;

// ---- Lrs: fastai's lr argument ----------------------------------------------

TEST(LrsTest, OneValueListsAndSlicesResolveAsFastaiDoes) {
  EXPECT_EQ(Lrs(3e-3).for_groups(3), (std::vector<double>{3e-3, 3e-3, 3e-3}));
  EXPECT_EQ(Lrs({1e-4, 1e-3}).for_groups(2), (std::vector<double>{1e-4, 1e-3}));
  // slice(hi): hi / 10 for all but the last group.
  EXPECT_EQ(lr_slice(1e-2).for_groups(3), (std::vector<double>{1e-3, 1e-3, 1e-2}));
  // slice(lo, hi): fastai's even_mults, geometric steps.
  const auto spread = lr_slice(1e-5, 1e-3).for_groups(3);
  ASSERT_EQ(spread.size(), 3u);
  EXPECT_DOUBLE_EQ(spread[0], 1e-5);
  EXPECT_NEAR(spread[1], 1e-4, 1e-18);
  EXPECT_NEAR(spread[2], 1e-3, 1e-17);
  EXPECT_EQ(spread, even_mults(1e-5, 1e-3, 3));
  EXPECT_EQ(lr_slice(1e-5, 1e-3).for_groups(1), std::vector<double>{1e-3});  // even_mults(n=1) is stop
  EXPECT_EQ(Lrs(2e-3).last(), 2e-3);
  EXPECT_EQ(lr_slice(1e-5, 1e-3).last(), 1e-3);
}

TEST(LrsTest, AListOfTheWrongLengthAndBadValuesAreErrorsNamingThem) {
  EXPECT_THROW_WITH(Lrs({1e-4, 1e-3, 1e-2}).for_groups(2),
                    "got 3 learning rates (0.0001,0.001,0.01) but the model has 2 parameter groups");
  EXPECT_THROW_WITH(Lrs(0.0), "Invalid lr: 0 (must be > 0)");
  EXPECT_THROW_WITH(Lrs({1e-3, -1.0}), "Invalid lr: -1");
  EXPECT_THROW_WITH(lr_slice(1e-2, 1e-3), "lr slice: the first group's lr 0.01 is above the last group's 0.001");
  EXPECT_THROW_WITH(Lrs(std::vector<double>{}), "empty list");
}

TEST(LrsTest, TheCliFormsParseAndPrintBack) {
  for (const char* text : {"0.003", "0.0001,0.001", "1e-05:0.001", ":0.01"}) {
    SCOPED_TRACE(text);
    EXPECT_EQ(Lrs::parse(text).str(), text);
    EXPECT_EQ(Lrs::parse(Lrs::parse(text).str()), Lrs::parse(text));
  }
  EXPECT_EQ(Lrs::parse("3e-3"), Lrs(3e-3));
  EXPECT_EQ(Lrs::parse("1e-4,1e-3"), Lrs({1e-4, 1e-3}));
  EXPECT_EQ(Lrs::parse("1e-5:1e-3"), lr_slice(1e-5, 1e-3));
  EXPECT_EQ(Lrs::parse(":1e-3"), lr_slice(1e-3));
  for (const char* bad : {"", "abc", "1e-3,", "1e-3,,1", "1:2:3", "1e-3x", ":"})
    EXPECT_THROW_WITH(Lrs::parse(bad), "invalid lr " + std::string(bad) + " (");
  EXPECT_THROW_WITH(Lrs::parse("-1e-3"), "Invalid lr");
}

TEST(LrsTest, RunConfigKeepsListsAndSlicesAndReadsOlderRunDirectories) {
  RunConfig c;
  c.lr = lr_slice(1e-5, 1e-3);
  c.split_at = "3,7";
  c.freeze_to = 1;
  const std::string json = c.to_json();
  EXPECT_NE(json.find("\"lr\": \"1e-05:0.001\""), std::string::npos) << json;
  const RunConfig back = RunConfig::from_json(json);
  EXPECT_EQ(back.lr, c.lr);
  EXPECT_EQ(back.split_at, "3,7");
  EXPECT_EQ(back.freeze_to, 1);
  // One learning rate stays a number, as args.json always had it.
  EXPECT_NE(RunConfig().to_json().find("\"lr\": 0.003"), std::string::npos);
  // A run directory written before parameter groups has neither field.
  std::string old = RunConfig().to_json();
  for (const char* field : {"  \"split_at\": \"\",\n", "  \"freeze_to\": 0,\n"}) {
    const size_t at = old.find(field);
    ASSERT_NE(at, std::string::npos) << field << old;
    old.erase(at, std::string(field).size());
  }
  const RunConfig older = RunConfig::from_json(old);
  EXPECT_TRUE(older.split_at.empty());
  EXPECT_EQ(older.freeze_to, 0);
}

// ---- The splitter --------------------------------------------------------------

/// Linear -> BatchNorm -> ReLU -> Linear: parameters 0.*, 1.* (norm), 3.*.
torch::nn::Sequential small_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 3));
}

TEST(SplitAtTest, GroupsStartAtTheNamedLayersInModelOrder) {
  auto net = small_net();
  const ParamGroups groups = split_at({"1", "3"})(*net);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_TRUE(groups[0][0].is_same(net[0]->named_parameters()["weight"]));
  EXPECT_EQ(groups[0].size(), 2u);  // 0.weight, 0.bias
  EXPECT_EQ(groups[1].size(), 2u);  // the norm layer's weight and bias
  EXPECT_EQ(groups[2].size(), 2u);
  EXPECT_EQ(split_at({"3.bias"})(*net).back().size(), 1u);  // a parameter's own name works too
}

TEST(SplitAtTest, BadSplitPointsAreErrorsNamingThem) {
  auto net = small_net();
  EXPECT_THROW_WITH(split_at({"head"})(*net),
                    "split_at: no parameter named 'head' or 'head.*' (the model's top-level children: 0, 1, 2, 3)");
  EXPECT_THROW_WITH(split_at({"0"})(*net), "'0' holds the model's first parameter");
  EXPECT_THROW_WITH(split_at({"3", "1"})(*net), "'1' comes before '3' in the model");
  EXPECT_THROW_WITH(split_names("3,,7"), "empty name in '3,,7'");
  EXPECT_EQ(split_names("3,7"), (std::vector<std::string>{"3", "7"}));
  // A splitter of one's own runs, and is checked, when the Learner is made.
  auto twice = [](torch::nn::Module& m) { return ParamGroups{m.parameters(), m.parameters()}; };
  EXPECT_THROW_WITH(Learner(small_net(), data::DataLoaders::from_split({test::blobs(64), test::blobs(32, 3, 4, 2)}, 16, 1),
                            cross_entropy(), LearnerOptions().progress(false).splitter(twice)),
                    "the splitter put a parameter in two groups");
}

// ---- Learner: discriminative learning rates, freeze ------------------------------

class ParamGroupsTest : public test::SeededTest {
 protected:
  static std::unique_ptr<Learner> make(bool train_bn = true) {
    return std::make_unique<Learner>(
        small_net(), data::DataLoaders::from_split({test::blobs(256, 3, 4, 41), test::blobs(64, 3, 4, 42)}, 32, 7),
        cross_entropy(),
        LearnerOptions().progress(false).metrics({accuracy()}).splitter(split_at({"3"})).train_bn(train_bn));
  }
};

/// Records each group's lr and the training position of every step, as the optimizer sees them.
class GroupLrProbe : public Callback {
 public:
  void before_step(Learner& learn) override {
    lrs.push_back(learn.group_lrs());
    pos.push_back(learn.pct_train());
    // Every optimizer param group holds its parameter group's lr (the undecayed ones too).
    for (const auto& g : learn.opt().param_groups())
      for (const auto& p : g.params())
        for (size_t k = 0; k < learn.param_groups().size(); ++k)
          for (const auto& q : learn.param_groups()[k])
            if (q.is_same(p)) EXPECT_EQ(g.options().get_lr(), lrs.back()[k]);
  }
  std::vector<std::vector<double>> lrs;
  std::vector<double> pos;
};

TEST_F(ParamGroupsTest, EachGroupFollowsTheOneCycleScheduleToItsOwnPeak) {
  auto learn = make();
  EXPECT_EQ(learn->n_groups(), 2);
  EXPECT_EQ(learn->opt().param_groups().size(), 4u);  // each group split into decayed and undecayed
  auto probe = std::make_shared<GroupLrProbe>();
  learn->fit_one_cycle(1, lr_slice(1e-4, 1e-2), {}, {probe});
  ASSERT_EQ(probe->lrs.size(), 8u);
  const auto peaks = even_mults(1e-4, 1e-2, 2);
  for (size_t i = 0; i < probe->lrs.size(); ++i)
    for (size_t g = 0; g < 2; ++g)
      EXPECT_EQ(probe->lrs[i][g], one_cycle_lr(peaks[g])(probe->pos[i])) << "step " << i << " group " << g;
  EXPECT_GT(probe->lrs[4][1], 50 * probe->lrs[4][0]);  // the groups really differ

  auto constant = std::make_shared<GroupLrProbe>();
  learn->fit(1, Lrs({1e-3, 3e-3}), {constant});
  for (const auto& lrs : constant->lrs) EXPECT_EQ(lrs, (std::vector<double>{1e-3, 3e-3}));
  EXPECT_EQ(learn->recorder().steps().back().lr, 3e-3);  // the Recorder reports the last group's, as fastai

  EXPECT_THROW_WITH(learn->fit(1, Lrs({1e-3, 1e-3, 1e-3})), "got 3 learning rates");
  EXPECT_THROW_WITH(learn->fit_one_cycle(1, Lrs(std::vector<double>{1e-3})), "but the model has 2 parameter groups");
  EXPECT_THROW_WITH(learn->set_lrs({1e-3}), "set_lrs: got 1 learning rates but the model has 2");
}

/// Detached copies of `ts`.
std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

/// Every state tensor of the optimizer's first `n` param groups (AdamW: step, exp_avg, exp_avg_sq).
std::vector<torch::Tensor> opt_state(torch::optim::Optimizer& opt, size_t n) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < n; ++i)
    for (const auto& p : opt.param_groups()[i].params()) {
      auto* state = mixtrain::compat::optimizer_state_of(opt, p);
      if (state == nullptr) continue;
      auto& s = static_cast<torch::optim::AdamWParamState&>(*state);
      out.push_back(s.exp_avg().clone());
      out.push_back(s.exp_avg_sq().clone());
      out.push_back(torch::tensor(s.step()));
    }
  return out;
}

struct FreezeCase {
  const char* name;
  Precision precision;
  bool flat_master;
};

class FreezeTest : public ParamGroupsTest, public ::testing::WithParamInterface<FreezeCase> {};

TEST_P(FreezeTest, FrozenGroupsWeightsAndOptimizerStateAreBitwiseUnchanged) {
  auto learn = make(/*train_bn=*/false);
  PrecisionOptions options;
  options.master().dtype(torch::kBFloat16).flat_master(GetParam().flat_master);
  learn->set_precision(GetParam().precision, options);
  learn->fit_one_cycle(1, 1e-2);  // every parameter has trained: optimizer state everywhere
  learn->freeze();
  EXPECT_EQ(learn->frozen_idx(), 1);
  for (const auto& p : learn->param_groups()[0]) EXPECT_FALSE(p.requires_grad());
  // The optimizer's groups: group 0's decayed and undecayed, then group 1's (master
  // weights keep the order, one flat buffer per group with flat_master).
  const size_t frozen_opt_groups = 2;
  const auto group0 = copies(learn->param_groups()[0]), group1 = copies(learn->param_groups()[1]);
  const auto state0 = opt_state(learn->opt(), frozen_opt_groups);
  ASSERT_FALSE(state0.empty());
  learn->fit_one_cycle(2, 1e-2);
  test::expect_bitwise_equal(copies(learn->param_groups()[0]), group0);
  test::expect_bitwise_equal(opt_state(learn->opt(), frozen_opt_groups), state0);
  EXPECT_FALSE(torch::equal(learn->param_groups()[1][0], group1[0]));  // the head trained
  EXPECT_EQ(learn->recorder().skipped_steps(), 0);

  learn->unfreeze();
  learn->fit_one_cycle(1, 1e-2);
  EXPECT_FALSE(torch::equal(learn->param_groups()[0][0], group0[0]));  // and now the body does
}

INSTANTIATE_TEST_SUITE_P(Precisions, FreezeTest,
                         ::testing::Values(FreezeCase{"fp32", Precision::kFp32, false},
                                           FreezeCase{"fp16", Precision::kFp16, false},
                                           FreezeCase{"bf16_master", Precision::kBf16Master, false},
                                           FreezeCase{"bf16_flat_master", Precision::kBf16Master, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(ParamGroupsTest, NormLayersInFrozenGroupsStillTrainWithTrainBn) {
  auto learn = make(/*train_bn=*/true);
  learn->freeze();
  const auto& body = learn->param_groups()[0];  // 0.weight, 0.bias, 1.weight (norm), 1.bias (norm)
  const auto before = copies(body);
  learn->fit_one_cycle(1, 1e-2);
  EXPECT_TRUE(torch::equal(body[0], before[0]));
  EXPECT_TRUE(torch::equal(body[1], before[1]));
  EXPECT_FALSE(torch::equal(body[2], before[2]));
  EXPECT_FALSE(torch::equal(body[3], before[3]));
}

TEST_F(ParamGroupsTest, FreezeToOutOfRangeIsAnErrorNamingTheRange) {
  auto learn = make();
  EXPECT_THROW_WITH(learn->freeze_to(2), "freeze_to(2): the model has 2 parameter groups, so n must be in [-1, 1]");
  EXPECT_THROW_WITH(learn->freeze_to(-2), "freeze_to(-2)");
  EXPECT_EQ(learn->frozen_idx(), 0);
  learn->freeze_to(-1);
  EXPECT_EQ(learn->frozen_idx(), 1);
}

TEST_F(ParamGroupsTest, FineTuneTrainsTheHeadFirstThenEverything) {
  auto learn = make(/*train_bn=*/false);
  const auto body = copies(learn->param_groups()[0]);
  auto probe = std::make_shared<GroupLrProbe>();
  learn->add_cb(probe);
  learn->fine_tune(1, 2e-3, /*freeze_epochs=*/1);
  EXPECT_EQ(learn->frozen_idx(), 0);
  ASSERT_EQ(probe->lrs.size(), 16u);
  // Frozen epoch: slice(base_lr) peaks at 2e-3 for the head; then slice(1e-3 / 100, 1e-3).
  EXPECT_EQ(probe->lrs[0][1], one_cycle_lr(2e-3, OneCycleOptions().pct_start(0.99))(probe->pos[0]));
  EXPECT_EQ(probe->lrs[8][0], one_cycle_lr(2e-3 / 2 / 100, OneCycleOptions().pct_start(0.3).div(5))(probe->pos[8]));
  EXPECT_FALSE(torch::equal(learn->param_groups()[0][0], body[0]));
  auto single = std::make_unique<Learner>(small_net(), learn->dls(), cross_entropy(), LearnerOptions().progress(false));
  EXPECT_THROW_WITH(single->fine_tune(1), "the model has one parameter group, so there is nothing to freeze");
}

/// Saves a checkpoint at the end of the first epoch.
class SaveAfterFirstEpoch : public Callback {
 public:
  explicit SaveAfterFirstEpoch(std::string path) : path_(std::move(path)) {}
  void after_epoch(Learner& learn) override {
    if (learn.epoch() == 0) learn.save(path_);
  }

 private:
  std::string path_;
};

TEST_F(ParamGroupsTest, ACheckpointKeepsGroupsMastersAndTheFrozenStateAndResumesBitwise) {
  const std::string path = test::scratch_dir("param_groups_ckpt") + "/ckpt.pt";
  auto bf16_master = [](Learner& l) {
    l.set_precision(Precision::kBf16Master,
                    PrecisionOptions().master(amp::MasterWeightsOptions().dtype(torch::kBFloat16)));
  };
  auto a = make();
  bf16_master(*a);
  a->freeze();
  a->fit_one_cycle(2, lr_slice(1e-3, 1e-2), {}, {std::make_shared<SaveAfterFirstEpoch>(path)});

  auto b = make();
  bf16_master(*b);
  b->load(path);
  EXPECT_EQ(b->frozen_idx(), 1);
  EXPECT_FALSE(b->param_groups()[0][0].requires_grad());
  b->fit_one_cycle(2, lr_slice(1e-3, 1e-2));
  test::expect_bitwise_equal(b->model().state_tensors(), a->model().state_tensors());

  // A learner whose splitter makes other groups is refused, and left as it was.
  auto one_group = std::make_unique<Learner>(small_net(), a->dls(), cross_entropy(), LearnerOptions().progress(false));
  bf16_master(*one_group);
  EXPECT_THROW_WITH(one_group->load(path), "saved with 2 parameter groups but this learner's splitter makes 1");
}

// ---- The CLI ---------------------------------------------------------------------

TEST(CliParamGroupsTest, SplitAtFreezeToAndLrListsTrainAndBadOnesAreOneLineErrors) {
  const std::string dir = test::fake_fashion_dir("cli_groups", 128, 32);
  const std::string out = test::scratch_dir("cli_groups_out");
  const std::string base = "train --data " + dir + " --bs 32 --threads 1 ";
  const CliResult r = run_cli(base + "--split-at 3,7 --freeze-to 1 --lr 1e-4:1e-2 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("3 parameter groups (split at 3,7), peak lr per group 0.0001 0.001 0.01; groups before 1 frozen"),
            std::string::npos)
      << r.out;
  EXPECT_NE(slurp(out + "/args.json").find("\"lr\": \"0.0001:0.01\""), std::string::npos);

  expect_usage_error(base + "--split-at 7 --lr 1e-4,1e-3,1e-2 --out " + out + "2",
                     "--lr 0.0001,0.001,0.01: got 3 learning rates (0.0001,0.001,0.01) but the model has 2 parameter "
                     "groups");
  expect_usage_error(base + "--lr 1e-4,1e-3 --out " + out + "3", "(--split-at makes groups)");
  expect_usage_error(base + "--split-at head --out " + out + "4",
                     "--split-at: no parameter named 'head' or 'head.*' (the model's top-level children: 0, 1, 2, "
                     "3, 4, 5, 6, 7)");
  expect_usage_error(base + "--split-at 7 --freeze-to 2 --out " + out + "5",
                     "invalid --freeze-to 2: --split-at 7 makes 2 parameter groups, so it must be in [0, 1]");
  expect_usage_error(base + "--freeze-to 1 --out " + out + "6", "--freeze-to 1 needs parameter groups");
  expect_usage_error(base + "--lr 1e-3:x --out " + out + "7", "invalid --lr 1e-3:x (takes 3e-3, a list 1e-4,1e-3");
  expect_usage_error(base + "--lr 1e-2:1e-3 --out " + out + "7", "invalid --lr 1e-2:1e-3: lr slice: the first group's");
  expect_usage_error("doctor --data " + dir + " --bs 32 --lr 1e-4,1e-3 --out " + out + "8",
                     "mixtrain doctor takes one --lr, got 0.0001,0.001");
}

} // namespace
