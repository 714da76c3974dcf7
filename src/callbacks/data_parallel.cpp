#include "mixtrain/callbacks/data_parallel.h"

#include "mixtrain/core/precision_callback.h"
#include "mixtrain/core/learner.h"

#include "util/archive_util.h"

#include <torch/torch.h>

#include <chrono>

namespace mixtrain::callbacks {

DataParallel::DataParallel(std::shared_ptr<distributed::ProcessGroup> group, DataParallelOptions options)
    : group_(std::move(group)), options_(options) {
  TORCH_CHECK(group_, "DataParallel needs a process group");
  TORCH_CHECK(options_.bucket_bytes() > 0, "DataParallel: bucket_bytes must be > 0");
  TORCH_CHECK(options_.comm_dtype() == c10::ScalarType::Float || options_.comm_dtype() == c10::ScalarType::Half ||
                  options_.comm_dtype() == c10::ScalarType::BFloat16,
              "DataParallel: comm_dtype must be Float, Half or BFloat16, got ", options_.comm_dtype());
  order = 1;
}

void DataParallel::save_state(torch::serialize::OutputArchive& ar) const {
  detail::write_i64(ar, "world_size", group_->world_size());
}

void DataParallel::check_state(torch::serialize::InputArchive& ar) const {
  const int64_t saved = detail::read_i64(ar, "world_size");
  TORCH_CHECK(saved == group_->world_size(), "saved by a run of ", saved, " ranks but this run has ",
              group_->world_size(), "; resume with the same number of ranks");
}

void DataParallel::before_fit(Learner& learn) {
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> state = learn.model().state_tensors();
    // Master weights were copied from the model when to_half() ran: they travel too.
    if (auto pc = learn.precision_cb())
      for (const auto& t : pc->state_tensors()) state.push_back(t);
    group_->broadcast(state, 0);
  }
  learn.dls().train.set_sharding(group_->world_size(), group_->rank());
  auto reduce_max = [group = group_](torch::Tensor& flag) {
    std::vector<torch::Tensor> one{flag};
    group->all_reduce_max(one);
  };
  if (auto pc = learn.precision_cb()) pc->set_found_inf_reducer(reduce_max);
}

void DataParallel::after_loss(Learner& learn) {
  if (!learn.training() || !learn.loss().defined()) return;
  // One all-reduce carries the loss (summed) and the stop request (any rank's).
  const std::atomic<bool>* request = options_.stop_request();
  const float stop_here = request && request->load() ? 1.0f : 0.0f;
  const torch::Tensor loss = learn.loss().detach().to(torch::kFloat).reshape({});
  // The flag lives where the loss does (a CUDA loss cannot be stacked with a CPU flag).
  std::vector<torch::Tensor> payload{torch::stack({loss, torch::full({}, stop_here, loss.options())})};
  group_->all_reduce_sum(payload);
  learn.loss() = (payload[0][0] / group_->world_size()).reshape({});
  if (options_.stop_agreed() && payload[0][1].item<float>() > 0) options_.stop_agreed()->store(true);
}

void DataParallel::after_backward(Learner& learn) {
  const auto start = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& p : learn.model().module().parameters()) {
    if (!p.requires_grad()) continue;
    // Every rank must send the same layout: a missing gradient travels as zeros.
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  const double inv_world = 1.0 / group_->world_size();
  size_t i = 0;
  while (i < grads.size()) {
    // One bucket: consecutive gradients of one dtype up to bucket_bytes.
    std::vector<torch::Tensor> bucket;
    int64_t bytes = 0;
    const auto dtype = grads[i].scalar_type();
    while (i < grads.size() && grads[i].scalar_type() == dtype &&
           (bucket.empty() || bytes + grads[i].nbytes() <= static_cast<size_t>(options_.bucket_bytes()))) {
      bytes += static_cast<int64_t>(grads[i].nbytes());
      bucket.push_back(grads[i++]);
    }
    std::vector<torch::Tensor> flat_parts;
    for (const auto& g : bucket) flat_parts.push_back(g.reshape({-1}));
    const auto comm = dtype == torch::kFloat ? options_.comm_dtype() : dtype;
    std::vector<torch::Tensor> flat{torch::cat(flat_parts).to(comm)};
    group_->all_reduce_sum(flat);
    torch::Tensor averaged = flat[0].to(dtype).mul_(inv_world);
    int64_t offset = 0;
    for (auto& g : bucket) {
      g.copy_(averaged.slice(0, offset, offset + g.numel()).view_as(g));
      offset += g.numel();
    }
  }
  comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++comm_steps_;
}

void DataParallel::after_train(Learner& learn) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> buffers = learn.model().module().buffers();
  if (!buffers.empty()) group_->broadcast(buffers, 0);
}

void DataParallel::after_fit(Learner& learn) {
  // The group may be gone by the next fit: do not leave it wired into the scalers.
  if (auto pc = learn.precision_cb()) pc->set_found_inf_reducer(nullptr);
  learn.dls().train.set_sharding(1, 0);
}

} // namespace mixtrain::callbacks
