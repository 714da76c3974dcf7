#pragma once
/// The loss-scale history a mixed-precision callback keeps (and fastai drops after fit).

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mixtrain::amp {

/// Scale used at every attempted optimizer step, skipped ones included.
struct ScaleHistory {
  std::vector<double> scales;
  std::vector<bool> skipped;

  void record(double scale, bool was_skipped) {
    scales.push_back(scale);
    skipped.push_back(was_skipped);
  }
  int64_t skipped_steps() const { return std::count(skipped.begin(), skipped.end(), true); }
};

} // namespace mixtrain::amp
