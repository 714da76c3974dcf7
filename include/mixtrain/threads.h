#pragma once
/// CPU thread settings that use every core without oversubscribing.

namespace mixtrain {

/// Sets libtorch's intra-op (OpenMP) threads to `n` (0: all cores) and pins
/// OpenBLAS to one thread, since libtorch already parallelizes around its calls.
/// Measured on this 2-core machine: 2 OpenMP + 1 OpenBLAS thread trained the
/// reference CNN 1.3x faster than libtorch's default of 1; 2 + 2 was slower.
/// Returns the number of intra-op threads set.
int configure_threads(int n = 0);

/// Threads OpenBLAS uses, or -1 when OpenBLAS is not the loaded BLAS.
int openblas_threads();

} // namespace mixtrain
