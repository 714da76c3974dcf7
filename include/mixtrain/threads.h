#pragma once
/// CPU thread settings that use every core without oversubscribing.

namespace mixtrain {

/// Sets libtorch's intra-op (OpenMP) threads to `n` (0: all cores) and pins
/// OpenBLAS to one thread, since libtorch already parallelizes around its calls
/// (OpenMP and OpenBLAS threads each on every core oversubscribe it; BENCHMARKS.md
/// has the measurements).
/// Returns the number of intra-op threads set.
int configure_threads(int n = 0);

/// Threads OpenBLAS uses, or -1 when OpenBLAS is not the loaded BLAS.
int openblas_threads();

} // namespace mixtrain
