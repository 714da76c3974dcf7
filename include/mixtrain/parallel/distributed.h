#pragma once
/// Process groups on torch's own c10d (Gloo for CPU tensors, NCCL for CUDA tensors
/// where torch has it), set up from
/// torchrun's environment variables, so torchrun, SLURM wrappers and mpirun
/// exporting the same variables all work.

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace mixtrain::distributed {

/// torchrun's variables. Without WORLD_SIZE (or with WORLD_SIZE=1) the process runs alone.
struct Env {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool active() const { return world_size > 1; }
};

/// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Throws
/// c10::Error naming the variable when one is malformed or inconsistent.
Env env_from_environment();

/// A group of ranks that can broadcast and all-reduce tensors (CPU: Gloo; CUDA: NCCL).
class ProcessGroup {
 public:
  /// Rendezvous through a TCPStore on MASTER_ADDR:MASTER_PORT (rank 0 hosts it)
  /// and connect with Gloo. `timeout` bounds the rendezvous and every collective:
  /// a rank that dies makes the others fail within it rather than hang.
  static std::shared_ptr<ProcessGroup> connect(const Env& env,
                                               std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~ProcessGroup();

  int rank() const;
  int world_size() const;
  /// Copies `root`'s tensors into every rank's (in place, same shapes on all ranks).
  void broadcast(std::vector<torch::Tensor>& tensors, int root = 0);
  /// In-place elementwise sum over ranks.
  void all_reduce_sum(std::vector<torch::Tensor>& tensors);
  /// In-place elementwise maximum over ranks.
  void all_reduce_max(std::vector<torch::Tensor>& tensors);
  void barrier();

 private:
  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace mixtrain::distributed
