// mixtrain train as a user meets it: bad input gives one line and exit 2; a
// small run writes its files; checkpoints, resume and the run folder.
#include "cli_util.h"
#include "test_util.h"

#include <mixtrain/run/options.h>

#include <random>

// run_cli, expect_usage_error, slurp, read_json, model_tensors, fake_fashion_dir, ...
using namespace mixtrain::test;

namespace {

using namespace mixtrain;


TEST(CliTest, HelpExplainsEveryFlag) {
  const CliResult r = run_cli("train --help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--data", "--model", "--epochs", "--lr", "--bs", "--seed", "--limit", "--threads", "--out",
                           "--precision", "--init-scale", "--growth-factor", "--backoff-factor", "--growth-interval",
                           "--clip", "--accum", "--no-emulation", "--loss-scale", "--max-noskip", "--max-scale",
                           "--flat-master"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  EXPECT_EQ(run_cli("--help").code, 0);
}

TEST(CliTest, BadValuesAreOneLineErrors) {
  const std::string dir = test::fake_fashion_dir("cli_values", 64, 32);
  const std::string base = "train --data " + dir + " --out " + test::scratch_dir("cli_values_out");
  expect_usage_error(base + " --lr -1", "invalid --lr");
  expect_usage_error(base + " --lr 0", "invalid --lr");
  expect_usage_error(base + " --bs 0", "invalid --bs");
  expect_usage_error(base + " --epochs 0", "invalid --epochs");
  expect_usage_error(base + " --limit 0", "invalid --limit");
  expect_usage_error(base + " --threads -2", "invalid --threads");
  expect_usage_error(base + " --model vgg", "unknown --model 'vgg': not a built-in model (cnn, mlp, resnet, transformer) and no such file");
  expect_usage_error(base + " --precision fp8", "unsupported precision 'fp8'");
  expect_usage_error(base + " --precision fp16 --growth-factor 1", "invalid --growth-factor 1: must be > 1");
  expect_usage_error(base + " --precision fp16 --backoff-factor 2", "invalid --backoff-factor");
  expect_usage_error(base + " --precision fp16 --growth-interval 0", "invalid --growth-interval");
  expect_usage_error(base + " --precision fp16 --no-emulation", "fp16 emulation on CPU is forbidden");
  expect_usage_error(base + " --precision fp16-master", "use --precision bf16-master");
  expect_usage_error(base + " --precision bf16-master --max-noskip 0", "invalid --max-noskip 0");
  expect_usage_error(base + " --precision bf16-master --max-scale 0.5", "invalid --max-scale 0.5");
  expect_usage_error(base + " --precision bf16-master --loss-scale -2", "invalid --loss-scale -2");
  expect_usage_error(base + " --clip -1", "invalid --clip");
  expect_usage_error(base + " --accum 0", "invalid --accum");
  expect_usage_error(base + " --lr abc", "--lr");
  expect_usage_error(base + " --bogus 1", "--bogus");
  expect_usage_error(base + " --bs 1000", "smaller than --bs 1000");
  expect_usage_error("", "subcommand");
}

TEST(CliTest, BadDataAndOutputAreOneLineErrors) {
  expect_usage_error("train --data /nonexistent/fashion", "--data /nonexistent/fashion not found");

  const std::string dir = test::fake_fashion_dir("cli_data", 64, 32);
  const std::string out = " --out " + test::scratch_dir("cli_data_out");
  const std::string images = dir + "/train-images-idx3-ubyte.gz";
  const auto good = test::read_raw(images);

  test::write_raw(images, std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2));
  expect_usage_error("train --data " + dir + out, "truncated");

  test::write_raw(images, test::idx_bytes({64, 28, 28}));  // not compressed
  expect_usage_error("train --data " + dir + out, "is not a gzip file");

  auto bad_magic = test::idx_bytes({64, 28, 28});
  bad_magic[1] = 7;
  test::write_gz(images, bad_magic);
  expect_usage_error("train --data " + dir + out, "bad idx magic");

  test::write_gz(images, test::idx_bytes({63, 28, 28}));
  expect_usage_error("train --data " + dir + out, "has 63 images but");

  test::write_raw(images, good);
  // A path below a regular file can never be created, even as root.
  expect_usage_error("train --bs 32 --data " + dir + " --out " + images + "/run", "cannot create --out directory");
}

TEST(CliTest, SmallRunWritesMetricsStepsAndSummary) {
  const std::string dir = test::fake_fashion_dir("cli_run", 256, 64);
  const std::string out = test::scratch_dir("cli_run_out");
  const CliResult r = run_cli("train --data " + dir + " --out " + out + " --bs 32 --epochs 2 --threads 1 --model mlp");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("valid accuracy"), std::string::npos) << r.out;
  const std::string summary = slurp(out + "/summary.json");
  for (const char* key : {"\"precision\": \"fp32\"", "\"epochs\": 2", "\"train_loss\"", "\"valid_loss\"",
                          "\"valid_accuracy\"", "\"seconds\"", "\"samples_per_second\"", "\"threads\": 1",
                          "\"torch_version\""})
    EXPECT_NE(summary.find(key), std::string::npos) << key;
  const std::string steps = slurp(out + "/steps.csv");
  EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 1 + 2 * 8);
  const std::string metrics = slurp(out + "/metrics.csv");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 3);
}

TEST(CliTest, Bf16RunRecordsNoScaleAndClipAccumWork) {
  const std::string dir = test::fake_fashion_dir("cli_bf16", 128, 32);
  const std::string out = test::scratch_dir("cli_bf16_out");
  const CliResult r = run_cli("train --data " + dir + " --out " + out +
                              " --bs 32 --threads 1 --model mlp --precision bf16 --clip 1 --accum 2");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string summary = slurp(out + "/summary.json");
  EXPECT_NE(summary.find("\"precision\": \"bf16\""), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"skipped_steps\": 0"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"final_scale\": null"), std::string::npos) << summary;
}

TEST(CliTest, Bf16MasterRunReportsParameterMemory) {
  const std::string dir = test::fake_fashion_dir("cli_master", 128, 32);
  const std::string out = test::scratch_dir("cli_master_out");
  const CliResult r = run_cli("train --data " + dir + " --out " + out +
                              " --bs 32 --threads 1 --precision bf16-master --flat-master --loss-scale 1024");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string summary = slurp(out + "/summary.json");
  // The CNN has 20,538 parameters: bf16 except BatchNorm's 96 (fp32); masters are all fp32.
  EXPECT_NE(summary.find("\"param_bytes_model\": 41268"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"param_bytes_master\": 82152"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"final_scale\": 1024"), std::string::npos) << summary;
  // model.pt holds the fp32 masters: their own validation is what the run says last, next to the bf16 copy's.
  EXPECT_NE(summary.find("\"returned_weights\": \"fp32 masters\""), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"returned_valid_accuracy\": "), std::string::npos) << summary;
  EXPECT_NE(r.out.find("(the fp32 master weights handed back; the bf16 copy validated in training: valid accuracy "),
            std::string::npos)
      << r.out;
}

TEST(CliTest, InterruptAtARandomBatchThenResumeIsBitwiseEqual) {
  const std::string dir = test::fake_fashion_dir("cli_resume", 256, 64);
  std::mt19937 rng(1234);  // a random batch, the same one every run of the test
  for (const std::string precision : {"fp32", "fp16 --init-scale 16777216", "bf16-master", "bf16-pure",
                                      "bf16-pure --weight-update stochastic", "bf16-pure --weight-update kahan"}) {
    SCOPED_TRACE(precision);
    const int64_t stop_at = std::uniform_int_distribution<int64_t>(1, 30)(rng);  // 2 epochs of 16 steps
    const std::string flags = " --data " + dir + " --bs 16 --epochs 2 --threads 1 --save-every 1 --precision " + precision;
    const std::string full = test::scratch_dir("cli_resume_full"), cut = test::scratch_dir("cli_resume_cut");
    ASSERT_EQ(run_cli("train" + flags + " --out " + full).code, 0);

    const CliResult interrupted = run_cli("train" + flags + " --out " + cut + " --interrupt-at-step " + std::to_string(stop_at));
    EXPECT_EQ(interrupted.code, 130) << interrupted.err;
    EXPECT_NE(interrupted.err.find("resume with: mixtrain train --resume " + cut), std::string::npos) << interrupted.err;
    EXPECT_TRUE(std::filesystem::exists(cut + "/checkpoint-" + std::to_string(stop_at) + ".pt"));

    const CliResult resumed = run_cli("train --resume " + cut);
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    const auto a = model_tensors(full + "/checkpoint-32.pt"), b = model_tensors(cut + "/checkpoint-32.pt");
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    for (const auto& kv : a) EXPECT_TRUE(torch::equal(kv.second, b.at(kv.first))) << kv.first;
    // The resumed run's logs hold the whole history.
    const std::string steps = slurp(cut + "/steps.csv");
    EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 1 + 32);
    // Finished: a second --resume would retrain from the interrupted checkpoint; it is refused.
    expect_usage_error("train --resume " + cut, "the run finished its 2 epoch(s); there is nothing to continue");
  }
}

TEST(CliTest, CheckpointDirectoriesAreProtectedAndKeepPrunes) {
  const std::string dir = test::fake_fashion_dir("cli_protect", 64, 32);
  const std::string out = test::scratch_dir("cli_protect_out");
  const std::string flags = " --data " + dir + " --bs 16 --epochs 3 --threads 1 --model mlp --save-every 1 --keep 2 --out " + out;
  ASSERT_EQ(run_cli("train" + flags).code, 0);
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoint-4.pt"));  // pruned: only the newest 2 kept
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint-8.pt"));
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint-12.pt"));
  expect_usage_error("train" + flags, "holds a finished run; name another folder, or pass --force to start over there");
  EXPECT_EQ(run_cli("train" + flags + " --force").code, 0);
  expect_usage_error("train --resume " + test::scratch_dir("cli_protect_empty"), "args.json not found");
  expect_usage_error("train --resume " + out + " --lr 1", "do not pass --lr");
  // A damaged checkpoint of a run that did not finish: one line, exit 2, no crash.
  std::filesystem::remove(out + "/finished");
  expect_usage_error("train" + flags, "already holds checkpoints; continue it with --resume");
  test::write_raw(out + "/checkpoint-12.pt", {1, 2, 3});
  expect_usage_error("train --resume " + out, "is corrupt or truncated");
  expect_usage_error("train --data " + dir + " --out " + test::scratch_dir("cli_protect_x") + " --save-every -1", "invalid --save-every");
  expect_usage_error("train --data " + dir + " --out " + test::scratch_dir("cli_protect_y") + " --max-bad-steps -1", "invalid --max-bad-steps");
}

TEST(CliTest, DivergingFp32RunStopsWithTheLastGoodCheckpoint) {
  const std::string dir = test::fake_fashion_dir("cli_nan", 256, 32);
  const std::string out = test::scratch_dir("cli_nan_out");
  const CliResult r = run_cli("train --data " + dir + " --out " + out + " --bs 16 --threads 1 --model mlp --lr 1e6");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("mixtrain: stopped: the loss became", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  const std::string latest = slurp(out + "/latest");
  ASSERT_FALSE(latest.empty());
  for (const auto& kv : model_tensors(out + "/" + latest.substr(0, latest.size() - 1)))
    EXPECT_TRUE(torch::isfinite(kv.second).all().item<bool>()) << kv.first;  // the last good weights
}

} // namespace

namespace {

// The new user's rough edges: each was found by running the CLI.
TEST(CliRoughEdgesTest, FlagsThatCannotWorkAreOneLineErrors) {
  const std::string dir = test::fake_fashion_dir("cli_rough", 64, 32);
  const std::string base = "train --data " + dir + " --out " + test::scratch_dir("cli_rough_out");
  expect_usage_error(base + " --seed -1", "invalid --seed -1: must be >= 0");
  expect_usage_error(base + " --bs 16 --accum 5", "--accum 5 is more than the 4 batches of an epoch");
  expect_usage_error("train --data " + dir + "/train-images-idx3-ubyte.gz", "is not a file written by torch.save");
}

TEST(CliRoughEdgesTest, UncompressedIdxFilesAreRead) {
  const std::string dir = test::fake_fashion_dir("cli_raw_idx", 64, 32);
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"}) {
    const std::string gz = dir + "/" + name + ".gz";
    ASSERT_EQ(std::system(("gunzip -f " + gz).c_str()), 0);
  }
  const CliResult r = run_cli("train --data " + dir + " --bs 16 --model mlp --threads 1 --out " +
                              test::scratch_dir("cli_raw_idx_out"));
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(CliRoughEdgesTest, FlagsThatDoNothingInTheChosenModeAreWarned) {
  const std::string dir = test::fake_fashion_dir("cli_warn", 64, 32);
  const std::string base = "train --data " + dir + " --bs 16 --model mlp --threads 1 --out " + test::scratch_dir("cli_warn_out");
  const CliResult fp32 = run_cli(base + " --init-scale 256 --force");
  EXPECT_EQ(fp32.code, 0) << fp32.err;
  EXPECT_NE(fp32.err.find("mixtrain: warning: --init-scale does nothing with --precision fp32"), std::string::npos) << fp32.err;
  const CliResult bf16 = run_cli(base + " --precision bf16 --loss-scale 8 --force");
  EXPECT_NE(bf16.err.find("mixtrain: warning: --loss-scale does nothing with --precision bf16"), std::string::npos) << bf16.err;
  const CliResult threads = run_cli("train --data " + dir + " --bs 16 --model mlp --threads 64 --out " +
                                    test::scratch_dir("cli_warn_threads"));
  EXPECT_NE(threads.err.find("--threads 64 is more than the "), std::string::npos) << threads.err;
  const CliResult quiet = run_cli(base + " --precision fp16 --init-scale 256 --force");
  EXPECT_EQ(quiet.err.find("warning"), std::string::npos) << quiet.err;
}

// Two runs started in the same second get their own default folders.
TEST(CliRoughEdgesTest, DefaultRunFoldersAreUnique) {
  const std::string dir = test::fake_fashion_dir("cli_unique", 64, 32);
  const std::string cwd = test::scratch_dir("cli_unique_cwd");
  const std::string run = std::string(MIXTRAIN_CLI_PATH) + " train --data " + dir + " --bs 16 --model mlp --threads 1 >/dev/null 2>&1";
  ASSERT_EQ(std::system(("cd " + cwd + " && (" + run + " & " + run + " & wait)").c_str()), 0);
  int folders = 0;
  for (const auto& e : std::filesystem::directory_iterator(cwd + "/runs")) folders += e.is_directory();
  EXPECT_EQ(folders, 2);
}

} // namespace

namespace {

// Run charts, keep-best and early stopping.
TEST(CliTrainTest, TrainWritesRunChartsAndKeepsTheBestEpoch) {
  const std::string dir = mixtrain::test::fake_fashion_dir("cli_charts", 128, 64);
  const std::string run = test::scratch_dir("cli_charts_out");
  const CliResult t = run_cli("train --data " + dir + " --bs 16 --epochs 3 --precision fp16 --save-best --early-stop 5 "
                              "--monitor accuracy --threads 1 --out " + run);
  ASSERT_EQ(t.code, 0) << t.err;
  for (const char* chart : {"/loss.svg", "/lr.svg", "/scale.svg"})
    EXPECT_NE(slurp(run + chart).find("</svg>"), std::string::npos) << chart;
  EXPECT_NE(slurp(run + "/lr.svg").find("Momentum"), std::string::npos);
  expect_usage_error("train --data " + dir + " --bs 16 --early-stop -2 --out " + run + "2", "invalid --early-stop -2");
  expect_usage_error("train --data " + dir + " --bs 16 --save-best --monitor acc --out " + run + "3",
                     "unknown --monitor 'acc' (choices: train_loss, valid_loss, accuracy)");
}

} // namespace

namespace {

// A run folder written by the first release: its args.json has none of the fields
// added since (the table's added_later rows). It resumes and trains to the end.
TEST(CliTrainTest, ARunFolderFromTheFirstReleaseResumesAndTrainsToTheEnd) {
  const std::string dir = test::fake_fashion_dir("cli_old_args", 128, 32);
  const std::string out = test::scratch_dir("cli_old_args_out");
  const CliResult cut = run_cli("train --data " + dir + " --bs 16 --epochs 2 --threads 1 --model mlp --out " + out +
                                " --interrupt-at-step 5");
  ASSERT_EQ(cut.code, 130) << cut.err;
  nlohmann::json args = nlohmann::json::parse(slurp(out + "/args.json"));
  std::vector<std::string> dropped;
  for (const auto& o : run::options())
    if (o.added_later && args.erase(o.key)) dropped.push_back(o.key);
  for (const char* later : {"loss", "wd_bn_bias", "monitor", "save_best", "early_stop", "split_at", "freeze_to", "ranks"})
    EXPECT_NE(std::find(dropped.begin(), dropped.end(), later), dropped.end()) << later;
  std::ofstream(out + "/args.json") << args.dump(2);
  const CliResult resumed = run_cli("train --resume " + out);
  ASSERT_EQ(resumed.code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resuming " + out), std::string::npos) << resumed.out;
  EXPECT_TRUE(std::filesystem::exists(out + "/finished"));
  EXPECT_TRUE(std::filesystem::exists(out + "/model.pt"));
  const std::string steps = slurp(out + "/steps.csv");
  EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 1 + 2 * 8);
  // A damaged one is said to be damaged; an unknown field is named, not called damage.
  std::filesystem::remove(out + "/finished");
  args["colour"] = "blue";
  std::ofstream(out + "/args.json") << args.dump(2);
  expect_usage_error("train --resume " + out, "unknown field 'colour'");
  std::ofstream(out + "/args.json") << "{\"model\": ";
  expect_usage_error("train --resume " + out, "args.json is damaged: not valid JSON");
}

} // namespace

