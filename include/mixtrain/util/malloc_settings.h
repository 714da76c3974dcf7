#pragma once
/// glibc's malloc as a training loop needs it from its first step.

namespace mixtrain {

/// glibc maps each block above its mmap threshold and unmaps it when freed. Both that
/// threshold and the heap's trim threshold start at 128 KiB, and glibc raises them
/// (to at most 32 and 64 MiB on 64-bit) only once a large mapped block is freed. Until
/// then every step maps its MB-sized activations again and takes a page fault on each
/// page: a program that trains before it frees anything large (a libtorch loop over
/// synthetic data) ran the default CNN's step 1.3x slower (BENCHMARKS.md).
///
/// Sets both thresholds to the most glibc's own sliding would give them, once a process;
/// the Learner calls it. It changes nothing where GLIBC_TUNABLES names either threshold
/// (the user chose), off glibc, or under AddressSanitizer (its own allocator). Returns
/// whether it set them.
bool settle_malloc_for_training();

} // namespace mixtrain
