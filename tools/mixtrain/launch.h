#pragma once
// `mixtrain launch`: N local ranks of one command, torchrun-style.

#include <string>
#include <vector>

namespace mixtrain_cli {

struct LaunchOptions {
  int nproc = 2;
  int master_port = 29500;
  std::string master_addr = "127.0.0.1";
  /// After one rank fails, the others get SIGTERM, then SIGKILL after this long.
  double kill_after_seconds = 10;
};

/// Runs `exe args...` as ranks 0..nproc-1 with RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR and MASTER_PORT set, prefixing each output line with "[rank k] ".
/// SIGINT/SIGTERM to the launcher are forwarded to every rank. When a rank
/// fails, the others are stopped. Returns 0 when all ranks succeed, else the
/// first failing rank's exit code (128 + signal for a signal).
int launch(const std::string& exe, const std::vector<std::string>& args, const LaunchOptions& options);

} // namespace mixtrain_cli
