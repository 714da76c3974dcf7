#include "mixtrain/util/host_read.h"

#include <ATen/ATen.h>

#include <atomic>

namespace mixtrain {

namespace {
std::atomic<int64_t> g_reads{0};
} // namespace

std::vector<double> read_to_host(const std::vector<at::Tensor>& scalars) {
  std::vector<double> values;
  if (scalars.empty()) return values;
  c10::Device device(c10::kCPU);
  for (const auto& t : scalars) {
    TORCH_CHECK(t.defined() && t.numel() == 1, "read_to_host: one-element tensors only");
    if (!t.device().is_cpu()) device = t.device();
  }
  std::vector<at::Tensor> packed;
  for (const auto& t : scalars) packed.push_back(t.detach().reshape({1}).to(device, at::kDouble));
  // The one transfer; an explicit copy also on the CPU, so a dispatcher-level count sees it there too.
  const at::Tensor host = at::cat(packed).to(c10::kCPU, at::kDouble, /*non_blocking=*/false, /*copy=*/true);
  ++g_reads;
  const double* p = host.data_ptr<double>();
  values.assign(p, p + host.numel());
  return values;
}

int64_t host_reads() { return g_reads.load(); }

} // namespace mixtrain
