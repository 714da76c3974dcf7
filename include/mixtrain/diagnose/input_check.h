#pragma once
/// Input checks: NaN/Inf in the data, and inputs that were never normalized
/// (the fp16 troubleshooting guide: "unnormalized inputs are the usual culprit").

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain::diagnose {

struct InputReport {
  int64_t numel = 0;
  int64_t nonfinite = 0;           ///< NaN/Inf elements
  double mean = 0, std = 0;        ///< over the finite elements
  double min = 0, max = 0;         ///< over the finite elements
  bool integer_valued = false;     ///< every finite value is a whole number
  bool raw_pixels = false;         ///< looks like raw 0-255 pixel values
  bool unnormalized = false;       ///< mean/std (overall or of some feature) far from 0/1
  std::vector<std::string> findings;  ///< one sentence per problem, empty when fine
  bool ok() const { return findings.empty(); }
};

/// Checks a batch or a whole dataset's inputs `x` (dim 0 indexes samples).
/// Unnormalized: |mean| > 3 or std > 10 overall, or for any feature when x is
/// 2-d (tabular data, judged per feature), or raw 0-255 pixels (integers in
/// [0, 255] reaching above 1.5).
InputReport check_inputs(const torch::Tensor& x);

} // namespace mixtrain::diagnose
