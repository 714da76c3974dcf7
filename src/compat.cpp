// The compat seam: what differs between torch builds and versions lives here.
#include "mixtrain/compat.h"

#include <ATen/autocast_mode.h>
#include <ATen/Context.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Logging.h>
#include <torch/cuda.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <ATen/ATen.h>

#include <dlfcn.h>

#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <fstream>
#include <string>

// The oldest torch mixtrain builds against: 2.4 gave autocast its per-DeviceType
// functions. (Tested: 2.13 on the CPU, 2.14 compiled with CUDA; README.)
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 4)
#error "mixtrain needs torch 2.4 or newer (scripts/setup.sh installs torch 2.13)"
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
  return at::autocast::is_autocast_enabled(device);
}

void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  check_device(device);
  at::autocast::set_autocast_enabled(device, enabled);
}

c10::ScalarType get_autocast_dtype(c10::DeviceType device) {
  check_device(device);
  return at::autocast::get_autocast_dtype(device);
}

void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  check_device(device);
  at::autocast::set_autocast_dtype(device, dtype);
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

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

torch::optim::OptimizerParamState* optimizer_state_of(torch::optim::Optimizer& optimizer, const at::Tensor& p) {
  auto& state = optimizer.state();
  const auto it = state.find(p.unsafeGetTensorImpl());
  return it == state.end() ? nullptr : it->second.get();
}

void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& p,
                         std::unique_ptr<torch::optim::OptimizerParamState> state) {
  optimizer.state()[p.unsafeGetTensorImpl()] = std::move(state);
}

void move_optimizer_state(torch::optim::Optimizer& from, const at::Tensor& from_param, torch::optim::Optimizer& to,
                          const at::Tensor& to_param) {
  auto& state = from.state();
  const auto it = state.find(from_param.unsafeGetTensorImpl());
  if (it == state.end()) return;
  auto moved = std::move(it->second);
  state.erase(it);
  to.state()[to_param.unsafeGetTensorImpl()] = std::move(moved);
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

std::string built_torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

std::string torch_version_in(const std::string& version_py) {
  static const std::regex pattern(R"(__version__\s*=\s*['"]([0-9]+\.[0-9]+\.[0-9]+))");
  std::smatch m;
  return std::regex_search(version_py, m, pattern) ? m[1].str() : "";
}

std::string loaded_torch_version(std::string* where) {
  // The shared object that holds one of c10's functions: .../torch/lib/libc10.so in a wheel.
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&c10::GetCPUAllocator), &info) == 0 || !info.dli_fname) return "";
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path torch_dir = fs::weakly_canonical(info.dli_fname, ec).parent_path().parent_path();
  const fs::path version_py = torch_dir / "version.py";
  if (ec || !fs::is_regular_file(version_py, ec) || fs::file_size(version_py, ec) > (1 << 16)) return "";
  std::ifstream f(version_py);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (where) *where = torch_dir.string();
  return torch_version_in(text);
}

std::string torch_mismatch() {
  std::string where;
  const std::string loaded = loaded_torch_version(&where), built = built_torch_version();
  if (loaded.empty() || loaded == built) return "";
  return "mixtrain was built against torch " + built + ", but it loaded torch " + loaded + " (" + where +
         "): reinstall mixtrain against this torch (pip install --no-build-isolation --force-reinstall mixtrain's "
         "source), or install torch==" + built;
}

} // namespace mixtrain::compat
