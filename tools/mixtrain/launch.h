#pragma once
// `mixtrain launch`: N local ranks of one command, torchrun-style.

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace mixtrain_cli {

/// `mixtrain train`'s exit code after an interrupt saved a checkpoint; also what
/// a process killed by SIGINT reports (128 + 2). The launcher relies on it.
constexpr int kExitInterrupted = 130;

struct LaunchOptions {
  int nproc = 2;
  /// Machines in the job, and this one's index (torchrun's --nnodes / --node-rank):
  /// this launcher's ranks are node_rank * nproc ... + nproc - 1 of nnodes * nproc.
  int nnodes = 1;
  int node_rank = 0;
  int master_port = 29500;
  std::string master_addr = "127.0.0.1";
  /// After one rank fails, the others get SIGTERM, then SIGKILL after this long.
  double kill_after_seconds = 10;
};

/// Adds `launch` and its flags (parsed into `options`) to the CLI.
CLI::App* add_launch_subcommand(CLI::App& app, LaunchOptions& options);

/// Throws UsageError for a command that is not `train ...` or a node rank outside the job.
void check_launch(const LaunchOptions& options, const std::vector<std::string>& command);

/// Runs `exe args...` as ranks 0..nproc-1 with RANK, WORLD_SIZE, LOCAL_RANK,
/// LOCAL_WORLD_SIZE (the ranks split the machine's cores: cpu_budget), MASTER_ADDR
/// and MASTER_PORT set, prefixing each output line with "[rank k] ".
/// Each rank runs in its own process group, so SIGINT/SIGTERM reach the ranks
/// once, forwarded by the launcher (a terminal's Ctrl-C included), and a rank
/// gets SIGTERM if the launcher dies. When a rank fails, the others are
/// stopped; a rank that exits 130 (interrupted) is not a failure, and the others
/// are left to stop with it. Returns 0 when all ranks succeed, 130 when they
/// were interrupted, else the first failing rank's exit code (128 + signal for
/// a signal).
int launch(const std::string& exe, const std::vector<std::string>& args, const LaunchOptions& options);

} // namespace mixtrain_cli
