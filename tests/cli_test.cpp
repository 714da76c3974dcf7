// The mixtrain CLI as a user meets it: bad input gives one line and exit 2;
// a small run writes its files.
#include "cli_util.h"
#include "test_util.h"

#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <map>
#include <random>
#include <thread>

using mixtrain::test::CliResult;
using mixtrain::test::expect_usage_error;
using mixtrain::test::run_cli;
using mixtrain::test::slurp;

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
  expect_usage_error(base + " --precision fp16 --growth-factor 1", "Invalid growth_factor: 1 (must be > 1)");
  expect_usage_error(base + " --precision fp16 --backoff-factor 2", "Invalid backoff_factor");
  expect_usage_error(base + " --precision fp16 --growth-interval 0", "Invalid growth_interval");
  expect_usage_error(base + " --precision fp16 --no-emulation", "fp16 emulation on CPU is forbidden");
  expect_usage_error(base + " --precision fp16-master", "use --precision bf16-master");
  expect_usage_error(base + " --precision bf16-master --max-noskip 0", "Invalid max_noskip: 0");
  expect_usage_error(base + " --precision bf16-master --max-scale 0.5", "Invalid max_scale: 0.5");
  expect_usage_error(base + " --precision bf16-master --loss-scale -2", "Invalid loss_scale: -2");
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
}

/// Model tensors of a checkpoint file, by key.
std::map<std::string, torch::Tensor> model_tensors(const std::string& path) {
  torch::serialize::InputArchive ar;
  Learner::open_checkpoint(path, ar);
  std::map<std::string, torch::Tensor> out;
  for (const auto& key : ar.keys()) {
    if (key.rfind("model.param.", 0) != 0 && key.rfind("model.buffer.", 0) != 0) continue;
    torch::Tensor t;
    ar.read(key, t);
    out[key] = t;
  }
  return out;
}

TEST(CliTest, InterruptAtARandomBatchThenResumeIsBitwiseEqual) {
  const std::string dir = test::fake_fashion_dir("cli_resume", 256, 64);
  std::mt19937 rng(1234);  // a random batch, the same one every run of the test
  for (const std::string precision : {"fp32", "fp16 --init-scale 16777216", "bf16-master"}) {
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
  expect_usage_error("train" + flags, "holds a finished run, or pass --force to start over there");
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

// ---- mixtrain doctor ----------------------------------------------------------

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(slurp(path)); }

TEST(CliDoctorTest, HealthyDefaultCnnWritesReportJsonAndCharts) {
  const std::string out = test::scratch_dir("doctor_healthy");
  const CliResult r = run_cli("doctor --limit 1024 --bs 128 --threads 1 --out " + out);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("verdict: healthy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fixes: none needed"), std::string::npos) << r.out;
  const auto j = read_json(out + "/diagnosis.json");
  EXPECT_EQ(j.at("verdict"), "healthy");
  EXPECT_EQ(j.at("evidence").at("fp32").at("steps"), 8);
  EXPECT_EQ(j.at("evidence").at("mixed").at("precision"), "fp16");
  EXPECT_TRUE(j.at("evidence").at("mixed").at("emulated").get<bool>());
  EXPECT_TRUE(j.at("fixes").empty());
  for (const char* svg : {"/loss.svg", "/scale.svg"}) {
    const std::string s = slurp(out + svg);
    EXPECT_EQ(s.rfind("<svg", 0), 0u) << svg;
    EXPECT_NE(s.find("</svg>"), std::string::npos) << svg;
  }
}

TEST(CliDoctorTest, ProblemsExitOneWithTheVerdict) {
  // A loss scale of 1e-7: every scaled gradient flushes to zero in fp16.
  const std::string out = test::scratch_dir("doctor_underflow");
  CliResult r = run_cli("doctor --limit 1024 --bs 128 --threads 1 --init-scale 1e-7 --out " + out);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("verdict: underflow"), std::string::npos) << r.out;
  auto j = read_json(out + "/diagnosis.json");
  EXPECT_EQ(j.at("verdict"), "underflow");
  EXPECT_NE(j.at("fixes").at(0).get<std::string>().find("raise the loss scale"), std::string::npos) << j.at("fixes");

  // fp16 with emulation forbidden on CPU: unsupported is a verdict (exit 1), not a flag error.
  const std::string out2 = test::scratch_dir("doctor_unsupported");
  r = run_cli("doctor --no-emulation --threads 1 --out " + out2);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_EQ(read_json(out2 + "/diagnosis.json").at("verdict"), "unsupported");
}

TEST(CliDoctorTest, BadFlagsAreOneLineErrors) {
  expect_usage_error("doctor --precision fp32", "doctor compares fp32 with fp16 or bf16");
  expect_usage_error("doctor --resume runs/x", "--resume");  // not a doctor flag: not expected
  expect_usage_error("doctor --lr 0", "invalid --lr");
  expect_usage_error("doctor --limit 500 --threads 1",
                     "too few training steps to judge: 1 (1 epoch(s) of 1 batches); the comparison needs at least 8");
  expect_usage_error("doctor --data /nonexistent", "--data /nonexistent not found");
}

} // namespace

// ---- mixtrain launch ----------------------------------------------------------

namespace {

int launch_port() {
  static int port = 31000 + static_cast<int>(::getpid() % 500) * 4;
  return port++;
}

std::vector<std::string> crc_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.find("crc32") != std::string::npos) lines.push_back(line.substr(line.find("crc32")));
  return lines;
}

TEST(CliLaunchTest, TwoRanksEndIdenticalAndMatchOneProcessWithTheGlobalBatch) {
  const std::string dist = test::scratch_dir("launch_two"), single = test::scratch_dir("launch_single");
  const std::string common = " --model mlp --limit 4096 --epochs 1 --threads 1 --seed 5";
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) + " -- train" +
                              common + " --bs 64 --out " + dist);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[rank 0] mixtrain train:"), std::string::npos) << r.out;
  const auto crcs = crc_lines(r.out);
  ASSERT_EQ(crcs.size(), 2u) << r.out;
  EXPECT_EQ(crcs[0].substr(0, 14), crcs[1].substr(0, 14)) << r.out;  // "crc32 xxxxxxxx" equal on both ranks
  ASSERT_EQ(run_cli("train" + common + " --bs 128 --out " + single).code, 0);
  const auto a = read_json(dist + "/summary.json"), b = read_json(single + "/summary.json");
  EXPECT_NEAR(a.at("valid_accuracy").get<double>(), b.at("valid_accuracy").get<double>(), 0.01);
  EXPECT_NEAR(a.at("valid_loss").get<double>(), b.at("valid_loss").get<double>(), 0.01);
  EXPECT_EQ(r.out.find("[rank 1] epoch"), std::string::npos) << r.out;  // only rank 0 reports the table
}

TEST(CliLaunchTest, ARankThatDiesEndsTheLaunchWithAClearErrorQuickly) {
  const auto start = std::chrono::steady_clock::now();
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) +
                              " -- train --model mlp --limit 4096 --epochs 2 --threads 1 --bs 64 --abort-at-step 5 --out " +
                              test::scratch_dir("launch_dies"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.code, 0);
  EXPECT_LT(seconds, 30.0);
  EXPECT_NE(r.err.find("mixtrain launch: rank 1 exited with code 134"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mixtrain launch: failed"), std::string::npos) << r.err;
}

TEST(CliLaunchTest, AnOverflowOnOneRankIsSkippedByBoth) {
  // --inject-overflow-at-step puts an inf into the last rank's gradients after the all-reduce.
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) +
                              " -- train --model mlp --limit 2048 --epochs 1 --threads 1 --bs 64 --precision fp16"
                              " --init-scale 256 --inject-overflow-at-step 4 --out " + test::scratch_dir("launch_overflow"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto crcs = crc_lines(r.out);
  ASSERT_EQ(crcs.size(), 2u) << r.out;
  for (const auto& line : crcs) EXPECT_NE(line.find("skipped 1,"), std::string::npos) << line;
  EXPECT_EQ(crcs[0].substr(0, 14), crcs[1].substr(0, 14)) << r.out;
}

TEST(CliLaunchTest, AnInterruptedLaunchResumesBitwiseEqualWithTheSameRanksOnly) {
  const std::string full = test::scratch_dir("launch_resume_full"), cut = test::scratch_dir("launch_resume_cut");
  const std::string flags = " --model mlp --limit 2048 --epochs 2 --threads 1 --bs 64 --save-every 1";
  auto launch = [](int nproc, const std::string& train_args) {
    return run_cli("launch --nproc " + std::to_string(nproc) + " --master-port " + std::to_string(launch_port()) +
                   " -- train" + train_args);
  };
  const CliResult whole = launch(2, flags + " --out " + full);
  ASSERT_EQ(whole.code, 0) << whole.out << whole.err;

  // A SIGINT on rank 1 only, after step 5: the stop request travels with the
  // next loss all-reduce, so both ranks stop after step 6 and rank 0 saves.
  const CliResult interrupted = launch(2, flags + " --out " + cut + " --interrupt-at-step 5");
  EXPECT_EQ(interrupted.code, 130) << interrupted.out << interrupted.err;
  EXPECT_NE(interrupted.out.find("resume with: mixtrain launch --nproc 2 -- train --resume " + cut), std::string::npos)
      << interrupted.out;
  EXPECT_NE(interrupted.err.find("mixtrain launch: interrupted; every rank stopped"), std::string::npos) << interrupted.err;
  EXPECT_EQ(interrupted.err.find("exited with code"), std::string::npos) << interrupted.err;  // not a failure
  ASSERT_TRUE(std::filesystem::exists(cut + "/checkpoint-6.pt"));

  // Another world size is refused, naming the mismatch, before anything changes.
  expect_usage_error("train --resume " + cut, "resume with: mixtrain launch --nproc 2 -- train --resume " + cut);
  const CliResult three = launch(3, " --resume " + cut);
  EXPECT_EQ(three.code, 2);
  EXPECT_NE(three.out.find("with 3 rank(s): it was trained by 2"), std::string::npos) << three.out;

  const CliResult resumed = launch(2, " --resume " + cut);
  ASSERT_EQ(resumed.code, 0) << resumed.out << resumed.err;
  const auto resumed_crcs = crc_lines(resumed.out), whole_crcs = crc_lines(whole.out);
  ASSERT_EQ(resumed_crcs.size(), 2u) << resumed.out;
  ASSERT_EQ(whole_crcs.size(), 2u) << whole.out;
  for (int k = 0; k < 2; ++k) EXPECT_EQ(resumed_crcs[k].substr(0, 14), whole_crcs[0].substr(0, 14));
  const auto a = model_tensors(full + "/checkpoint-32.pt"), b = model_tensors(cut + "/checkpoint-32.pt");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& kv : a) EXPECT_TRUE(torch::equal(kv.second, b.at(kv.first))) << kv.first;
}

TEST(CliLaunchTest, CtrlCAtTheTerminalStopsEveryRankOnceWithACheckpoint) {
  // A terminal's Ctrl-C sends SIGINT to its whole foreground process group. The
  // launcher runs here as the leader of such a group, as a shell would start it.
  const std::string data = test::fake_fashion_dir("launch_ctrl_c_data", 512, 64);
  const std::string out = test::scratch_dir("launch_ctrl_c"), log = out + ".log";
  std::filesystem::remove(log);  // an earlier run's log would look like training under way
  const std::vector<std::string> args = {
      MIXTRAIN_CLI_PATH, "launch", "--nproc", "2", "--master-port", std::to_string(launch_port()), "--", "train",
      "--data", data, "--model", "mlp", "--epochs", "500", "--threads", "1", "--bs", "16", "--out", out};
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  // Once rank 0 has finished an epoch, training is under way on both ranks.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (slurp(log).find("[rank 0] 0   ") == std::string::npos && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_NE(slurp(log).find("[rank 0] 0   "), std::string::npos) << slurp(log);
  ASSERT_EQ(::kill(-pid, SIGINT), 0);

  int status = 0;
  bool ended = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(ended = ::waitpid(pid, &status, WNOHANG) == pid) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!ended) {
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the launch did not stop within 60 s of one SIGINT\n" << slurp(log);
  }
  const std::string text = slurp(log);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;
  // Both ranks stopped together and rank 0 saved; the launcher did not take the
  // ranks' 130 for a failure. (A rank that got the terminal's SIGINT and the
  // launcher's forwarded one would exit at once, without a checkpoint; the two
  // usually merge into one pending signal, so this test cannot catch that race,
  // which the ranks' own process groups rule out.)
  EXPECT_NE(text.find("[rank 0] mixtrain: interrupted; checkpoint saved to " + out + "/checkpoint-"), std::string::npos) << text;
  EXPECT_NE(text.find("mixtrain launch: interrupted; every rank stopped"), std::string::npos) << text;
  EXPECT_EQ(text.find("exited with code"), std::string::npos) << text;
  const std::string latest = slurp(out + "/latest");
  ASSERT_FALSE(latest.empty());
  EXPECT_FALSE(model_tensors(out + "/" + latest.substr(0, latest.size() - 1)).empty());
}

TEST(CliLaunchTest, BadLaunchUsageIsAOneLineError) {
  expect_usage_error("launch --nproc 0 -- train", "--nproc: Value 0 not in range");
  expect_usage_error("launch --nproc 2", "launch runs 'train'");
  expect_usage_error("launch --nproc 2 --bogus -- train", "--bogus");
  expect_usage_error("launch -- train", "--nproc is required");
  expect_usage_error("train --comm-dtype int8", "invalid --comm-dtype 'int8'");
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
  EXPECT_NE(threads.err.find("--threads 64 is more than this machine's"), std::string::npos) << threads.err;
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

// A launch in which a rank would get no full batch is refused before any rank trains.
TEST(CliRoughEdgesTest, ALaunchWhereARankGetsNoBatchIsRefused) {
  const std::string dir = test::fake_fashion_dir("cli_launch_small", 64, 32);
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) +
                              " -- train --data " + dir + " --bs 48 --model mlp --threads 1 --out " +
                              test::scratch_dir("cli_launch_small_out"));
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("(64 samples, 32 per rank of 2) is smaller than --bs 48"), std::string::npos) << r.out << r.err;
}

} // namespace

namespace {

// A rank whose MASTER_ADDR nobody listens on gives up after --timeout with one line
// naming the address it could not reach (not libtorch's message after 60 s).
TEST(CliRoughEdgesTest, AnUnreachableRendezvousIsNamedAfterTheTimeout) {
  const std::string dir = test::fake_fashion_dir("cli_rendezvous", 64, 32);
  const std::string err = std::string(MIXTRAIN_TEST_TMP) + "/rendezvous.err";
  const int port = launch_port();
  const std::string cmd = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                          " WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 " + MIXTRAIN_CLI_PATH + " train --data " + dir +
                          " --bs 16 --model mlp --threads 1 --timeout 2 >/dev/null 2>" + err;
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_LT(seconds, 30);
  const std::string text = slurp(err);
  EXPECT_NE(text.find("rank 1 could not reach the rendezvous at 127.0.0.1:" + std::to_string(port) + " (rank 0 hosts it) within 2 s"),
            std::string::npos) << text;
  // Our line is the last one, whole (libtorch's glog may log its socket timeout before it).
  const std::string last = text.substr(text.rfind('\n', text.size() - 2) + 1);
  EXPECT_EQ(last.rfind("mixtrain: error: rank 1 could not reach the rendezvous", 0), 0u) << text;
}

} // namespace

namespace {

/// Two "machines" on this one: network namespaces joined by a veth pair, private
/// addresses inside them only. Removed (with the veth) when the test ends.
struct TwoNodes {
  std::string a, b, va, vb;
  bool ok = false;
  TwoNodes() {
    const std::string id = std::to_string(::getpid() % 100000);
    a = "mtA" + id, b = "mtB" + id, va = "mtva" + id, vb = "mtvb" + id;
    const std::string setup = "ip netns add " + a + " && ip netns add " + b + " && ip link add " + va +
                              " type veth peer name " + vb + " && ip link set " + va + " netns " + a +
                              " && ip link set " + vb + " netns " + b + " && ip -n " + a + " addr add 10.231.0.1/24 dev " +
                              va + " && ip -n " + b + " addr add 10.231.0.2/24 dev " + vb + " && ip -n " + a +
                              " link set " + va + " up && ip -n " + b + " link set " + vb + " up && ip -n " + a +
                              " link set lo up && ip -n " + b + " link set lo up";
    ok = std::system((setup + " >/dev/null 2>&1").c_str()) == 0;
  }
  ~TwoNodes() {
    if (!ok) return;
    for (const std::string& ns : {a, b})  // nothing outlives the test: its processes, then the namespace
      std::system(("ip netns pids " + ns + " | xargs -r kill -9; ip netns del " + ns + " 2>/dev/null").c_str());
  }
  /// The launch command for node `rank` (0 in namespace a, 1 in b), output to `log`.
  std::string node(int rank, int port, const std::string& train, const std::string& log) const {
    return "ip netns exec " + (rank == 0 ? a : b) + " env GLOO_SOCKET_IFNAME=" + (rank == 0 ? va : vb) + " " +
           MIXTRAIN_CLI_PATH + " launch --nproc 1 --nnodes 2 --node-rank " + std::to_string(rank) +
           " --master-addr 10.231.0.1 --master-port " + std::to_string(port) + " -- train " + train + " >" + log +
           " 2>&1";
  }
};

std::string crc_of(const std::string& log) {
  const std::string text = slurp(log);
  const auto at = text.find("buffers crc32 ");
  return at == std::string::npos ? "" : text.substr(at + 14, 8);
}

// A real 2-node run on one machine: each node in its own network namespace, the
// rendezvous and Gloo over the veth. The nodes end bitwise identical; killing one
// node mid-run ends the other within seconds, naming the lost rank.
TEST(CliMultiNodeTest, TwoNodesEndIdenticalAndALostNodeIsNamedWithinSeconds) {
  TwoNodes net;
  if (!net.ok) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  const std::string dir = test::fake_fashion_dir("cli_multinode", 64, 32);
  const std::string tmp = std::string(MIXTRAIN_TEST_TMP);
  const std::string train = "--data " + dir + " --bs 16 --model mlp --threads 1 --timeout 20";
  int port = launch_port();
  const std::string log0 = tmp + "/node0.log", log1 = tmp + "/node1.log";
  ASSERT_EQ(std::system(("(" + net.node(0, port, train + " --out " + tmp + "/multinode_out", log0) + ") & " +
                         net.node(1, port, train, log1) + "; wait").c_str()),
            0)
      << slurp(log0) << slurp(log1);
  EXPECT_EQ(crc_of(log0).size(), 8u) << slurp(log0);
  EXPECT_EQ(crc_of(log0), crc_of(log1)) << slurp(log0) << slurp(log1);

  // A long run; node 1 dies (every process in its namespace, SIGKILL) after 3 s.
  port = launch_port() + 1;
  const std::string long_run = train + " --epochs 1000";
  const std::string done = tmp + "/node0.done";
  std::filesystem::remove(done);
  std::filesystem::remove(log0);
  std::system(("(" + net.node(0, port, long_run + " --force --out " + tmp + "/multinode_long", log0) + "; echo $? >" +
               done + ") & (" + net.node(1, port, long_run, log1) + ") &")
                  .c_str());
  // Once both nodes train (node 0 printed its second epoch's row; slow starts under
  // sanitizers take seconds), node 1 dies.
  const auto started = std::chrono::steady_clock::now();
  while (slurp(log0).find("[rank 0] 1 ") == std::string::npos && !std::filesystem::exists(done) &&
         std::chrono::steady_clock::now() - started < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_NE(slurp(log0).find("[rank 0] 1 "), std::string::npos) << slurp(log0) << slurp(log1);
  std::system(("ip netns pids " + net.b + " | xargs -r kill -9").c_str());
  const auto killed = std::chrono::steady_clock::now();
  while (!std::filesystem::exists(done) && std::chrono::steady_clock::now() - killed < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(seconds, 10.0) << "node 0 took " << seconds << " s to notice";
  EXPECT_NE(slurp(done), "0\n");
  EXPECT_NE(slurp(log0).find("lost rank 1"), std::string::npos) << slurp(log0);
}

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
  expect_usage_error("lr_find --data " + dir + " --bs 16 --num-it 1 --out " + out, "num_it must be >= 2");

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
