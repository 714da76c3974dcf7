#pragma once
/// The public names that were renamed or moved, kept as deprecated aliases for
/// at least one minor version (CHANGELOG.md lists each with its version). Using
/// one compiles, with a warning that names its replacement.

#include "mixtrain/amp/reduced_precision_emulation.h"
#include "mixtrain/core/precision_callback.h"

namespace mixtrain::amp {

/// Renamed ReducedPrecisionEmulation in 0.2.0 (it emulates bf16 too); goes in 0.3.0.
using Fp16Emulation [[deprecated("mixtrain::amp::Fp16Emulation is mixtrain::amp::ReducedPrecisionEmulation since 0.2.0")]] =
    ReducedPrecisionEmulation;

/// Moved to core in 0.2.0 (the Learner calls it): mixtrain::PrecisionCallback; goes in 0.3.0.
using PrecisionCallback [[deprecated("mixtrain::amp::PrecisionCallback is mixtrain::PrecisionCallback since 0.2.0")]] =
    mixtrain::PrecisionCallback;
/// Moved with PrecisionCallback: mixtrain::ParamMemory; goes in 0.3.0.
using ParamMemory [[deprecated("mixtrain::amp::ParamMemory is mixtrain::ParamMemory since 0.2.0")]] = mixtrain::ParamMemory;

} // namespace mixtrain::amp
