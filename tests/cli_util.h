#pragma once
// Running the mixtrain CLI from tests, as a user would: its exit code and output.

#include <gtest/gtest.h>
#include <mixtrain/core/learner.h>
#include <nlohmann/json.hpp>
#include <torch/serialize.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

namespace mixtrain::test {

struct CliResult {
  int code;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline CliResult run_cli(const std::string& args) {
  const std::string dir = std::string(MIXTRAIN_TEST_TMP);
  std::filesystem::create_directories(dir);
  // Per-test file names: ctest may run the CLI tests in parallel.
  const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string out = dir + "/" + name + ".out", err = dir + "/" + name + ".err";
  const std::string cmd = std::string(MIXTRAIN_CLI_PATH) + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(out), slurp(err)};
}

/// Exit 2 and exactly one line on stderr that contains `substr`.
inline void expect_usage_error(const std::string& args, const std::string& substr) {
  SCOPED_TRACE(args);
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(substr), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("mixtrain: error: ", 0), 0u) << r.err;
}

/// A JSON file the CLI wrote (summary.json, diagnosis.json).
inline nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(slurp(path)); }

/// Model tensors of a checkpoint file, by key.
inline std::map<std::string, torch::Tensor> model_tensors(const std::string& path) {
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

} // namespace mixtrain::test
