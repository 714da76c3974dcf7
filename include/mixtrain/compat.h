#pragma once
/// The one seam where torch builds and versions differ (implemented in src/compat.cpp,
/// the only place that reads TORCH_VERSION_*; it refuses torch older than 2.4):
/// autocast state, CUDA and CPU capabilities, the optimizer's state map, logging.
/// Everything else in mixtrain is version-independent.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <string>

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
/// Whether the CPU has AVX2 and FMA (the hand-vectorized CPU kernels' instructions), asked once.
bool cpu_has_avx2_fma();
/// The optimizer's state for parameter `p`, or nullptr before its first step.
torch::optim::OptimizerParamState* optimizer_state_of(torch::optim::Optimizer& optimizer, const at::Tensor& p);
/// Sets the optimizer's state for parameter `p` (a restored one: a training loop's).
void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& p,
                         std::unique_ptr<torch::optim::OptimizerParamState> state);
/// Moves the optimizer state of `from_param` in `from` to `to_param` in `to` (the same
/// optimizer or a rebuilt one: master weights swap the tensors an optimizer steps); no-op
/// before its first step. The state's tensors must fit `to_param` (the caller checks shapes).
void move_optimizer_state(torch::optim::Optimizer& from, const at::Tensor& from_param, torch::optim::Optimizer& to,
                          const at::Tensor& to_param);
/// Sets the lowest severity libtorch's own log lines print (0 info, 1 warning,
/// 2 error, 3 fatal) and returns the previous one: glog's minloglevel where
/// libtorch was built to log through glog, c10's caffe2_log_level otherwise.
int set_torch_min_log_level(int level);

/// The torch version mixtrain was compiled against ("2.13.0").
std::string built_torch_version();
/// The version of the torch whose libc10 this process loaded, read from the `version.py`
/// a pip-installed torch keeps beside its lib/ folder ("2.14.1", without "+cpu"); "" where
/// that cannot be told (a plain libtorch download). `where` gets the torch folder.
std::string loaded_torch_version(std::string* where = nullptr);
/// The version in a torch `version.py`'s text (`__version__ = '2.13.0+cpu'` gives "2.13.0"); "" if none.
std::string torch_version_in(const std::string& version_py);
/// One line saying the loaded torch is not the one mixtrain was built against, or "" when
/// it is (or cannot be told). Checked where a front end starts: a torch upgraded under a
/// pip-installed mixtrain otherwise dies mid-run with an undefined symbol (exit 127).
std::string torch_mismatch();

} // namespace mixtrain::compat
