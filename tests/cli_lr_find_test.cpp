// mixtrain lr_find as a user meets it: its chart and table, its own flags and help.
#include "cli_util.h"
#include "test_util.h"

// run_cli, expect_usage_error, slurp, read_json, model_tensors, fake_fashion_dir, ...
using namespace mixtrain::test;

namespace {
using namespace mixtrain;
} // namespace

namespace {

// fastai's ergonomics in the CLI: lr_find, keep-best, early stopping, run charts.
TEST(CliErgonomicsTest, LrFindWritesItsChartAndTableAndTrainWritesRunCharts) {
  const std::string dir = test::fake_fashion_dir("cli_lr_find", 128, 64);
  const std::string out = test::scratch_dir("cli_lr_find_out");
  const CliResult r = run_cli("lr_find --data " + dir + " --bs 16 --num-it 20 --threads 1 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("suggestions: valley "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cycled through it 3 times"), std::string::npos) << r.out;  // 8 batches, 20 steps
  EXPECT_NE(slurp(out + "/lr_find.svg").find("</svg>"), std::string::npos);
  const std::string csv = slurp(out + "/lr_find.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 21);  // header + 20 steps
  expect_usage_error("lr_find --data " + dir + " --bs 16 --num-it 1 --out " + out, "invalid --num-it 1: must be >= 7");
  // Too few points for a suggestion were nan suggestions; now the same one line.
  expect_usage_error("lr_find --data " + dir + " --bs 16 --num-it 6 --out " + out, "invalid --num-it 6: must be >= 7");

}

// lr_find's help speaks of lr_find only, and a train or doctor flag is refused in one line.
TEST(CliLrFindTest, HelpListsOnlyItsOwnFlagsAndForeignFlagsAreOneLineErrors) {
  const CliResult help = run_cli("lr_find --help");
  ASSERT_EQ(help.code, 0);
  for (const char* own : {"--start-lr", "--end-lr", "--num-it", "--precision", "--out", "--bs"})
    EXPECT_NE(help.out.find(own), std::string::npos) << own;
  for (const char* foreign : {"--epochs", "--lr ", "--resume", "--save-best", "--split-at", "--comm-dtype"})
    EXPECT_EQ(help.out.find(foreign), std::string::npos) << foreign << " in\n" << help.out;
  EXPECT_NE(help.out.find("Directory for lr_find.svg and lr_find.csv"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("fp32 (default)"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("diagnosis.json"), std::string::npos) << help.out;

  expect_usage_error("lr_find --lr 5 --epochs 7", "mixtrain lr_find does not take --lr (train and doctor do)");
  expect_usage_error("lr_find --epochs=7", "mixtrain lr_find does not take --epochs");
  expect_usage_error("lr_find --resume runs/x", "mixtrain lr_find does not take --resume (train does)");
  expect_usage_error("lr_find --start-lr 0", "invalid --start-lr 0: must be > 0");
  expect_usage_error("lr_find --start-lr 1 --end-lr 0.5", "invalid --end-lr 0.5: must be above the start lr 1");
}

} // namespace
