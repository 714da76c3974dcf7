// The compat seam: every difference between libtorch 1.13 and 2.x lives here.
#include "mixtrain/compat.h"

#include <ATen/autocast_mode.h>
#include <ATen/Context.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Logging.h>
#include <torch/cuda.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

// libtorch 2.4 replaced the per-device functions (set_enabled, set_cpu_enabled,
// set_autocast_gpu_dtype, ...) with ones taking a DeviceType.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define MIXTRAIN_AUTOCAST_DEVICE_API 1
#else
#define MIXTRAIN_AUTOCAST_DEVICE_API 0
#endif

namespace mixtrain::compat {

namespace {
void check_device(c10::DeviceType device) {
  TORCH_CHECK(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA,
              "autocast supports CPU and CUDA devices, got ", device);
}
} // namespace

bool is_autocast_enabled(c10::DeviceType device) {
  check_device(device);
#if MIXTRAIN_AUTOCAST_DEVICE_API
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  check_device(device);
#if MIXTRAIN_AUTOCAST_DEVICE_API
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CPU)
    at::autocast::set_cpu_enabled(enabled);
  else
    at::autocast::set_enabled(enabled);
#endif
}

c10::ScalarType get_autocast_dtype(c10::DeviceType device) {
  check_device(device);
#if MIXTRAIN_AUTOCAST_DEVICE_API
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  check_device(device);
#if MIXTRAIN_AUTOCAST_DEVICE_API
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CPU)
    at::autocast::set_autocast_cpu_dtype(dtype);
  else
    at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}

int increment_nesting() { return at::autocast::increment_nesting(); }
int decrement_nesting() { return at::autocast::decrement_nesting(); }
void clear_autocast_cache() { at::autocast::clear_cache(); }

bool cuda_available() { return torch::cuda::is_available(); }

bool cuda_bf16_supported(int device_index) {
  if (!cuda_available()) return false;
  // Ampere (sm_80) and newer; queried through ATen's CUDA hooks (which ask the
  // current device, hence the guard) so that this file compiles against CPU-only
  // libtorch too.
  c10::OptionalDeviceGuard on_device;
  if (device_index >= 0) on_device.reset_device(c10::Device(c10::DeviceType::CUDA, device_index));
  return at::detail::getCUDAHooks().supportsBFloat16ConvolutionWithCuDNNv8();
}

bool is_autocast_cache_enabled() { return at::autocast::is_autocast_cache_enabled(); }
void set_autocast_cache_enabled(bool enabled) { at::autocast::set_autocast_cache_enabled(enabled); }

bool cpu_has_native_bf16() {
  // MIXTRAIN_CPU_BF16=0 makes a bf16 CPU behave as one without (tests, benchmarks).
  if (const char* forced = std::getenv("MIXTRAIN_CPU_BF16")) return std::string(forced) != "0";
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0)
      return line.find("avx512_bf16") != std::string::npos || line.find("amx_bf16") != std::string::npos;
  return false;
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  const at::Tensor future = at::ones({t, t}, q.options().dtype(at::kBool)).triu(1);
  const at::Tensor logits = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  return at::matmul(at::softmax(logits.masked_fill(future, -std::numeric_limits<double>::infinity()), -1), v);
#endif
}

namespace {
/// The key libtorch's optimizer state map uses for a parameter: its TensorImpl as
/// text (1.13's c10::guts::to_string) or as a pointer. A template, so that only the
/// branch of this libtorch's key type is compiled.
template <typename Key>
Key state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << p.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}
} // namespace

torch::optim::OptimizerParamState* optimizer_state_of(torch::optim::Optimizer& optimizer, const at::Tensor& p) {
  auto& state = optimizer.state();
  using Key = typename std::decay_t<decltype(state)>::key_type;
  const auto it = state.find(state_key<Key>(p));
  return it == state.end() ? nullptr : it->second.get();
}

int set_torch_min_log_level(int level) {
#ifdef C10_USE_GLOG
  const int previous = FLAGS_minloglevel;
  FLAGS_minloglevel = level;
#else
  const int previous = FLAGS_caffe2_log_level;
  FLAGS_caffe2_log_level = level;
#endif
  return previous;
}

} // namespace mixtrain::compat
