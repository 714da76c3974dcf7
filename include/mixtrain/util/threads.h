#pragma once
/// CPU thread settings that use every core without oversubscribing.

namespace mixtrain {

/// Where the threads go. Both use `n` threads in all, never n on each side:
/// OpenMP and OpenBLAS threads each on every core oversubscribe it (BENCHMARKS.md
/// has the measurements).
enum class ThreadPolicy {
  /// libtorch's intra-op (OpenMP) threads, OpenBLAS at one thread: libtorch
  /// parallelizes around its BLAS calls. Best for convolutional nets.
  kIntraOp,
  /// OpenBLAS threads, libtorch's intra-op at one: best when large matrix
  /// products dominate (the transformer spends about 90% of a step in them).
  kBlas,
};

/// Uses `n` threads as `policy` says; 0 means all cores: `cpu_budget().threads()`, the
/// physical cores this process may use (its CPU affinity and cgroup quota), or
/// OMP_NUM_THREADS / MKL_NUM_THREADS when set. Returns the count set.
int configure_threads(int n = 0, ThreadPolicy policy = ThreadPolicy::kIntraOp);

/// Threads OpenBLAS uses, or -1 when OpenBLAS is not the loaded BLAS.
int openblas_threads();

} // namespace mixtrain
