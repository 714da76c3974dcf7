#pragma once
// Private: the MIXTRAIN_* switches that tests, benchmarks and users set to take another
// path (MIXTRAIN_CONTIGUOUS_CONV=1, MIXTRAIN_TORCH_BATCH_NORM=1, MIXTRAIN_CPU_AVX2=0). One
// reading rule for all of them: only the exact documented value switches; unset, empty or
// any other text keeps the default, so a typo can never take a path nobody asked for.
// (MIXTRAIN_CPU_BF16 is read in compat.cpp, below every layer, by its own rule: any value
// but 0 forces the CPU's bf16 kernels on.)

#include <cstdlib>
#include <cstring>

namespace mixtrain::detail {

/// Whether environment variable `name` is set to exactly `value`.
inline bool env_equals(const char* name, const char* value) {
  const char* set = std::getenv(name);
  return set != nullptr && std::strcmp(set, value) == 0;
}

} // namespace mixtrain::detail
