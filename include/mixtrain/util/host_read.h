#pragma once
/// Device-to-host reads: each one stalls a GPU's pipeline until the step's work
/// is done. Every value a training step needs on the host (the loss for the log
/// and the NaN stop, found_inf for the loss scaler) goes through read_to_host, so
/// a step makes at most one transfer (the values it needs read together) and the
/// transfers can be counted (summary.json's host_reads_per_step).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace mixtrain {

/// The values of one-element tensors (any dtype, any device), read to the host in
/// one transfer. CPU tensors among device ones go to the device first (a
/// host-to-device copy, which does not stall).
std::vector<double> read_to_host(const std::vector<at::Tensor>& scalars);

/// How many read_to_host calls this process has made, on every thread.
int64_t host_reads();

} // namespace mixtrain
