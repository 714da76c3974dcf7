#include "mixtrain/amp/unscale.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <atomic>
#include <cstring>

namespace mixtrain::amp {

namespace {

/// A contiguous run of one tensor's elements; work is split into these so that
/// many small gradients and one huge one parallelize equally well.
struct Chunk {
  void* data;
  int64_t n;
  at::ScalarType dtype;
};
constexpr int64_t kChunkElems = int64_t(1) << 16;

// The bit tests below detect inf/NaN as "exponent all ones". Unlike std::isfinite
// they compile to integer ops that GCC vectorizes, and they are immune to
// -ffast-math assumptions.

// target_clones: one AVX2 and one baseline build of each loop, picked at load time.
__attribute__((target_clones("avx2", "default"))) bool unscale_f32(float* p, int64_t n, float inv, bool scale) {
  uint32_t bad = 0;
  if (scale) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, 4);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
      p[i] *= inv;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, 4);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
  }
  return bad != 0;
}

__attribute__((target_clones("avx2", "default"))) bool unscale_f64(double* p, int64_t n, double inv, bool scale) {
  uint64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t bits;
    std::memcpy(&bits, p + i, 8);
    bad |= static_cast<uint64_t>((bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull);
    if (scale) p[i] *= inv;
  }
  return bad != 0;
}

/// 16-bit floats: half has exponent mask 0x7c00, bfloat16 0x7f80.
template <typename T, uint16_t kExpMask>
bool unscale_16(T* p, int64_t n, float inv, bool scale) {
  uint16_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, p + i, 2);
    bad |= static_cast<uint16_t>((bits & kExpMask) == kExpMask);
    if (scale) p[i] = static_cast<T>(static_cast<float>(p[i]) * inv);
  }
  return bad != 0;
}

bool run_chunk(const Chunk& c, float inv, bool scale) {
  switch (c.dtype) {
    case at::kFloat: return unscale_f32(static_cast<float*>(c.data), c.n, inv, scale);
    case at::kDouble: return unscale_f64(static_cast<double*>(c.data), c.n, static_cast<double>(inv), scale);
    case at::kHalf: return unscale_16<c10::Half, 0x7c00>(static_cast<c10::Half*>(c.data), c.n, inv, scale);
    case at::kBFloat16: return unscale_16<c10::BFloat16, 0x7f80>(static_cast<c10::BFloat16*>(c.data), c.n, inv, scale);
    default: TORCH_INTERNAL_ASSERT(false, "unsupported dtype");
  }
}

bool check_and_unscale(const std::vector<torch::Tensor>& tensors, float inv, bool scale) {
  std::vector<Chunk> chunks;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back;  // (original, contiguous copy)
  std::vector<torch::Tensor> keep_alive;  // contiguous copies the chunks point into
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    TORCH_CHECK(t.device().is_cpu(), "non_finite_check_and_unscale_cpu: tensor on ", t.device());
    TORCH_CHECK(t.layout() == at::kStrided, "non_finite_check_and_unscale_cpu: sparse gradients are not supported");
    const auto dt = t.scalar_type();
    TORCH_CHECK(dt == at::kFloat || dt == at::kDouble || dt == at::kHalf || dt == at::kBFloat16,
                "non_finite_check_and_unscale_cpu: unsupported dtype ", dt);
    torch::Tensor c = t;
    if (!t.is_contiguous()) {  // rare (e.g. a grad of a transposed view); unscale a copy and write it back
      c = t.contiguous();
      keep_alive.push_back(c);
      if (scale) copy_back.emplace_back(t, c);
    }
    char* base = static_cast<char*>(c.data_ptr());
    const int64_t item = c.element_size();
    for (int64_t start = 0; start < c.numel(); start += kChunkElems)
      chunks.push_back({base + start * item, std::min(kChunkElems, c.numel() - start), dt});
  }
  std::atomic<bool> found{false};
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    bool local = false;
    for (int64_t i = begin; i < end; ++i) local |= run_chunk(chunks[i], inv, scale);
    if (local) found.store(true, std::memory_order_relaxed);
  });
  for (auto& pair : copy_back) pair.first.copy_(pair.second);
  return found.load();
}

} // namespace

bool non_finite_check_and_unscale_cpu(const std::vector<torch::Tensor>& grads, float inv_scale) {
  return check_and_unscale(grads, inv_scale, inv_scale != 1.0f);
}

torch::Tensor non_finite_flag(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> cpu, device;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    (t.device().is_cpu() ? cpu : device).push_back(t);
  }
  const bool on_cpu = check_and_unscale(cpu, 1.0f, false);
  if (device.empty()) return torch::full({1}, on_cpu ? 1.0f : 0.0f);
  auto opts = torch::TensorOptions().dtype(at::kFloat).device(device.front().device());
  torch::Tensor found_inf = torch::full({1}, on_cpu ? 1.0f : 0.0f, opts);
  non_finite_check_and_unscale_(device, found_inf, torch::ones({1}, opts));  // no host sync
  return found_inf;
}

bool has_non_finite(const std::vector<torch::Tensor>& tensors) {
  return non_finite_flag(tensors).item<float>() != 0.0f;  // one read, for every tensor's device together
}

void non_finite_check_and_unscale_(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf,
                                   const torch::Tensor& inv_scale) {
  if (grads.empty()) return;
  if (grads.front().device().is_cpu()) {
    if (non_finite_check_and_unscale_cpu(grads, inv_scale.item<float>())) found_inf.fill_(1.0);
    return;
  }
  // ATen's fused multi-tensor kernel (CUDA): no host sync, found_inf stays on device. It
  // takes fp32, fp16 and fp64 only; bf16 gradients (bf16-master's bf16 model) are checked
  // and unscaled with tensor ops, on the device too (the fused kernel raised "not
  // implemented for 'BFloat16'" on an H200).
  std::vector<torch::Tensor> fused, other;
  for (const auto& g : grads) {
    const auto dt = g.scalar_type();
    (dt == at::kFloat || dt == at::kHalf || dt == at::kDouble ? fused : other).push_back(g);
  }
  if (!fused.empty()) at::_amp_foreach_non_finite_check_and_unscale_(fused, found_inf, inv_scale);
  for (const auto& g : other) {
    found_inf.copy_(torch::maximum(found_inf, g.isfinite().logical_not().any().to(found_inf.dtype())));
    g.mul_(inv_scale);
  }
}

} // namespace mixtrain::amp
