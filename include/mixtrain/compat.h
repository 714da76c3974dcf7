#pragma once
/// The one seam where libtorch 1.13 and 2.x differ (implemented in src/compat.cpp,
/// the only place that reads TORCH_VERSION_*): autocast state, CUDA and CPU
/// capabilities, and attention. Everything else in mixtrain is version-independent.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace at { class Tensor; }
namespace torch::optim { class Optimizer; class OptimizerParamState; }

namespace mixtrain::compat {

bool is_autocast_enabled(c10::DeviceType device);
void set_autocast_enabled(c10::DeviceType device, bool enabled);
c10::ScalarType get_autocast_dtype(c10::DeviceType device);
void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype);
int increment_nesting();
int decrement_nesting();
void clear_autocast_cache();
/// Whether this libtorch was built with CUDA and a GPU is visible.
bool cuda_available();
/// Whether GPU `device_index` (-1: the current one) supports bf16 (compute capability >= 8.0).
bool cuda_bf16_supported(int device_index = -1);
bool is_autocast_cache_enabled();
void set_autocast_cache_enabled(bool enabled);
/// Whether the CPU has native bf16 instructions (AVX512-BF16 or AMX). The
/// environment variable MIXTRAIN_CPU_BF16=0 (or 1) overrides what /proc/cpuinfo says.
bool cpu_has_native_bf16();
/// Causal self-attention softmax(q k^T / sqrt(d) + causal mask) v over [B, H, T, d]
/// tensors: torch 2.x's fused scaled_dot_product_attention where libtorch has it,
/// the explicit matmul / masked_fill / softmax / matmul on 1.13.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
/// The optimizer's state for parameter `p`, or nullptr before its first step.
/// (libtorch keys the state by the parameter's TensorImpl, as text in 1.13.)
torch::optim::OptimizerParamState* optimizer_state_of(torch::optim::Optimizer& optimizer, const at::Tensor& p);
/// Sets the lowest severity libtorch's own log lines print (0 info, 1 warning,
/// 2 error, 3 fatal) and returns the previous one: glog's minloglevel where
/// libtorch logs through glog (Debian's 1.13), c10's caffe2_log_level elsewhere.
int set_torch_min_log_level(int level);

} // namespace mixtrain::compat
