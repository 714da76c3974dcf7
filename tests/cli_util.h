#pragma once
// Running the mixtrain CLI from tests, as a user would: its exit code and output.

#include "test_util.h"

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
#include <mutex>
#include <unistd.h>
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

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

/// `wrap` goes before the CLI's path on the shell line: "timeout 5 ", or
/// "trap '' XFSZ; exec prlimit --fsize=N " (a full disk, as far as the run sees).
inline CliResult run_cli(const std::string& args, const std::string& wrap = "") {
  const std::string dir = std::string(MIXTRAIN_TEST_TMP);
  std::filesystem::create_directories(dir);
  // Per-test file names: ctest may run the CLI tests in parallel.
  const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string out = dir + "/" + name + ".out", err = dir + "/" + name + ".err";
  const std::string cmd = wrap + std::string(MIXTRAIN_CLI_PATH) + " " + args + " >" + out + " 2>" + err;
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

/// The folder the Python script tests/python/SCRIPT writes its models and data
/// files into, run once per process by `python` (one folder per process: ctest runs
/// tests in parallel processes, and scratch_dir empties its folder). The build's
/// Python has torch (scripts/setup.sh); without it every test that needs the files
/// fails, not skips.
inline const std::string& exported_by(const std::string& script, const std::string& python = MIXTRAIN_PYTHON) {
  static std::mutex mutex;
  static std::map<std::string, std::string> done;
  const std::lock_guard<std::mutex> lock(mutex);
  const bool can_run = python != MIXTRAIN_PYTHON || python_torch_available();
  if (!can_run) ADD_FAILURE() << kNoPythonTorch;
  const auto hit = done.find(script);
  if (hit != done.end()) return hit->second;
  const std::string dir = scratch_dir(script.substr(0, script.rfind('.')) + "_" + std::to_string(::getpid()));
  if (can_run) {
    const std::string cmd = python + " " + MIXTRAIN_SOURCE_DIR + "/tests/python/" + script + " " + dir + " > " + dir +
                            "/export.log 2>&1";
    if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << "running " << script << " failed: " << slurp(dir + "/export.log");
  }
  return done[script] = dir;
}

} // namespace mixtrain::test
