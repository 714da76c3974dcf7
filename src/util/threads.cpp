#include "mixtrain/util/threads.h"

#include "mixtrain/util/cpu_budget.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

namespace mixtrain {

namespace {
// OpenBLAS is reached through libtorch's BLAS dependency, not linked by us, so
// its controls are looked up at run time; without OpenBLAS they are absent.
template <typename Fn>
Fn openblas_symbol(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_DEFAULT, name));
}
} // namespace

int configure_threads(int n, ThreadPolicy policy) {
  TORCH_CHECK(n >= 0, "Invalid thread count: ", n, " (must be >= 1, or 0 for all cores)");
  // Not hardware_concurrency(): that counts CPUs a pinned or quota-held process cannot use.
  if (n == 0) n = cpu_budget().threads();
  auto set_blas = openblas_symbol<void (*)(int)>("openblas_set_num_threads");
  if (policy == ThreadPolicy::kBlas && set_blas) {
    at::set_num_threads(1);
    set_blas(n);
  } else {
    at::set_num_threads(n);
    if (set_blas) set_blas(1);
  }
  return n;
}

int openblas_threads() {
  auto get = openblas_symbol<int (*)()>("openblas_get_num_threads");
  return get ? get() : -1;
}

} // namespace mixtrain
