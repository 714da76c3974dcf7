#pragma once
/// RAII autocast guard (the torch-version differences it needs are in mixtrain/compat.h).

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace at { class Tensor; }

namespace mixtrain::amp {

/// Enables autocast for `device` with `dtype` for the guard's lifetime, like
/// Python's `torch.autocast(device, dtype)`. Nestable: on exit it restores the
/// previous enabled flag, dtype and cache flag, and when the outermost guard exits it clears
/// the cast cache (skipping that leaks memory, pytorch#46649).
///
/// Example:
///   {
///     mixtrain::amp::autocast guard(torch::kCUDA, torch::kHalf);
///     auto out = model->forward(x);    // matmuls/convs in fp16
///   }
class autocast {
 public:
  /// `cache_enabled`: cache the casts of weights within the region (torch.autocast's
  /// default); the previous setting is restored on exit.
  autocast(c10::DeviceType device, c10::ScalarType dtype, bool enabled = true, bool cache_enabled = true);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  c10::DeviceType device_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};


} // namespace mixtrain::amp
