#pragma once
/// Data-parallel training: one Learner per rank, kept identical by c10d.

#include "mixtrain/core/callback.h"
#include "mixtrain/parallel/distributed.h"

#include <torch/arg.h>

#include <atomic>
#include <memory>

namespace mixtrain::callbacks {

/// Aliases, because TORCH_ARG pastes its type textually (`const T&`).
using StopRequest = const std::atomic<bool>*;
using StopAgreed = std::atomic<bool>*;

struct DataParallelOptions {
  /// Gradients are flattened into buckets of at most this many bytes, one all-reduce each.
  TORCH_ARG(int64_t, bucket_bytes) = int64_t(25) << 20;
  /// Dtype gradients travel in: kFloat, or kHalf to halve the traffic (under
  /// fp16 loss scaling an overflow in transit becomes a skipped step, as it
  /// would on any rank).
  TORCH_ARG(c10::ScalarType, comm_dtype) = c10::ScalarType::Float;
  /// A stop request (a signal handler sets it on some rank, at any moment). It
  /// travels with the loss all-reduce; when any rank requested a stop,
  /// `stop_agreed` is set on every rank at the same batch, so a Checkpointer
  /// watching `stop_agreed` ends the fit on all ranks together.
  TORCH_ARG(StopRequest, stop_request) = nullptr;
  TORCH_ARG(StopAgreed, stop_agreed) = nullptr;
};

/// Makes a Learner one rank of a data-parallel job (DDP's semantics):
/// - before_fit: parameters and buffers are broadcast from rank 0; the training
///   loader becomes shard `rank` of `world_size` (--bs is per rank, the global
///   batch is world_size times it); the loss scaler's found_inf (MixedPrecision)
///   or MasterWeights' overflow flag is all-reduced (MAX) before every skip
///   decision, so all ranks skip the same steps and keep identical scales.
/// - after_loss: the logged loss becomes the mean over ranks (every rank reports global values).
/// - after_backward: gradients are averaged over ranks with bucketed all-reduce.
/// - after_train: buffers (BatchNorm running statistics, which each rank
///   accumulates on its own shard) are broadcast from rank 0 before validation,
///   as DDP's broadcast_buffers does, so evaluation and checkpoints agree.
/// Validation runs the whole validation set on every rank: the models are
/// identical, so are the metrics, and no reduction is needed.
/// Order 1: before every other callback, so that masters and scalers see the
/// broadcast weights and the averaged gradients.
class DataParallel : public Callback {
 public:
  explicit DataParallel(std::shared_ptr<distributed::ProcessGroup> group, DataParallelOptions options = {});
  std::string name() const override { return "DataParallel"; }

  const distributed::ProcessGroup& group() const { return *group_; }
  /// Seconds spent in gradient all-reduce, and the steps it covered.
  double comm_seconds() const { return comm_seconds_; }
  int64_t comm_steps() const { return comm_steps_; }

  /// The world size is saved: a run resumes exactly only with as many ranks
  /// (each rank's shard of the epoch depends on it), so another count is refused.
  std::string state_key() const override { return "data_parallel"; }
  void save_state(torch::serialize::OutputArchive& ar) const override;
  void check_state(torch::serialize::InputArchive& ar) const override;

  void before_fit(Learner& learn) override;
  void after_loss(Learner& learn) override;
  void after_backward(Learner& learn) override;
  void after_train(Learner& learn) override;
  void after_fit(Learner& learn) override;

 private:
  std::shared_ptr<distributed::ProcessGroup> group_;
  DataParallelOptions options_;
  double comm_seconds_ = 0;
  int64_t comm_steps_ = 0;
};

} // namespace mixtrain::callbacks
