// mixtrain doctor as a user meets it: the verdict, diagnosis.json and the charts; bad flags.
#include "cli_util.h"
#include "test_util.h"

// run_cli, expect_usage_error, slurp, read_json, model_tensors, fake_fashion_dir, ...
using namespace mixtrain::test;

namespace {

using namespace mixtrain;

// ---- mixtrain doctor ----------------------------------------------------------


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

// A doctor stopped during its trials keeps what it knew: the verdict was written
// before the first trial, and the stop writes it again as interrupted.
TEST(CliDoctorTest, OneSigtermDuringTheTrialsKeepsTheDiagnosis) {
  const std::string dir = test::scratch_dir("doctor_sigterm");
  const std::string out = dir + "/run", log = dir + "/doctor";
  // The underflow case (every trial a mixed run); one SIGTERM once trial 1 has started.
  const std::string doctor = std::string(MIXTRAIN_CLI_PATH) + " doctor --limit 1024 --bs 128 --threads 1 --init-scale 1e-7 --out " + out;
  const std::string script = doctor + " > " + log + ".out 2> " + log + ".err & pid=$!; "
                             "while ! grep -q 'doctor: trial 1' " + log + ".out; do kill -0 $pid 2>/dev/null || break; sleep 0.1; done; "
                             "kill -TERM $pid; wait $pid; echo $? > " + log + ".code";
  ASSERT_EQ(std::system(script.c_str()), 0);  // std::system runs it with sh
  const std::string err = slurp(log + ".err");
  EXPECT_EQ(std::stoi(slurp(log + ".code")), 130) << err;
  EXPECT_NE(err.find("mixtrain doctor: stopped during trial "), std::string::npos) << err;
  EXPECT_NE(err.find("verdict underflow and the "), std::string::npos) << err;
  const auto j = read_json(out + "/diagnosis.json");
  EXPECT_EQ(j.at("verdict"), "underflow");
  EXPECT_EQ(j.at("trials_status"), "interrupted");
  EXPECT_FALSE(j.at("fixes").empty());
}

/// diagnosis.json without its wall-clock times (trials[].seconds, timing, replay's seconds).
nlohmann::json without_seconds(nlohmann::json j) {
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto& [key, value] : j.items())
      if (key != "seconds" && key != "timing" && key.find("_seconds") == std::string::npos) out[key] = without_seconds(value);
    return out;
  }
  if (j.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (auto& value : j) out.push_back(without_seconds(value));
    return out;
  }
  return j;
}

// The same doctor twice on the same machine and thread count gives the same diagnosis.json,
// bit for bit but for its wall-clock times: the verdict, the evidence and every trial's numbers
// (the README's lost_updates case, whose trial the head start once made differ between
// doctors), on both bf16 paths.
TEST(CliDoctorTest, TheSameDoctorTwiceGivesTheSameDiagnosis) {
  for (const char* real_bf16 : {"0", "1"}) {
    SCOPED_TRACE(std::string("MIXTRAIN_CPU_BF16=") + real_bf16);
    nlohmann::json first;
    for (int round = 0; round < 2; ++round) {
      const std::string out = test::scratch_dir(std::string("doctor_twice_") + real_bf16 + "_" + std::to_string(round));
      const CliResult r = run_cli("doctor --model mlp --precision bf16-pure --limit 2048 --lr 1e-4 --epochs 2 --threads 2 --out " +
                                      out,
                                  std::string("MIXTRAIN_CPU_BF16=") + real_bf16 + " ");
      ASSERT_EQ(r.code, 1) << r.out << r.err;
      const nlohmann::json j = without_seconds(read_json(out + "/diagnosis.json"));
      EXPECT_EQ(j.at("verdict"), "lost_updates");
      EXPECT_FALSE(j.at("trials").empty());
      if (round == 0) first = j;
      else EXPECT_EQ(j.dump(), first.dump());
    }
  }
}

TEST(CliDoctorTest, BadFlagsAreOneLineErrors) {
  expect_usage_error("doctor --precision fp32", "the doctor compares fp32 with --precision fp16, --precision bf16 or "
                                                "--precision bf16-pure (default: fp16), not fp32");
  expect_usage_error("doctor --resume runs/x", "--resume");  // not a doctor flag: not expected
  expect_usage_error("doctor --lr 0", "invalid --lr");
  expect_usage_error("doctor --limit 500 --threads 1",
                     "too few training steps to judge: 1 (1 epoch(s) of 1 batches); the comparison needs at least 8");
  expect_usage_error("doctor --data /nonexistent", "--data /nonexistent not found");
}

} // namespace
