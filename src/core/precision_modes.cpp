// The table of precision modes (mixtrain/core/precision_modes.h): one row per mode, and
// the lookups every layer asks instead of switching on the mode.
#include "mixtrain/core/precision_modes.h"

#include <c10/util/Exception.h>

#include <vector>

namespace mixtrain {

const std::vector<PrecisionMode>& precision_modes() {
  using c10::ScalarType;
  //                                                          compute               scales master pure  doctor warn  islands
  static const std::vector<PrecisionMode> kModes = {
      {Precision::kFp32, "fp32", ScalarType::Float, false, false, false, false, false, false},
      {Precision::kFp16, "fp16", ScalarType::Half, true, false, false, true, true, true},
      {Precision::kBf16, "bf16", ScalarType::BFloat16, false, false, false, true, false, true},
      {Precision::kFp16Master, "fp16-master", ScalarType::Half, true, true, false, false, false, true},
      {Precision::kBf16Master, "bf16-master", ScalarType::BFloat16, true, true, false, false, false, true},
      {Precision::kBf16Pure, "bf16-pure", ScalarType::BFloat16, false, false, true, true, true, true},
  };
  return kModes;
}

const PrecisionMode& mode_of(Precision precision) {
  for (const auto& m : precision_modes())
    if (m.precision == precision) return m;
  TORCH_INTERNAL_ASSERT(false, "unknown Precision ", static_cast<int>(precision));
}

std::vector<Precision> modes_where(bool PrecisionMode::*flag) {
  std::vector<Precision> out;
  for (const auto& m : precision_modes())
    if (m.*flag) out.push_back(m.precision);
  return out;
}

} // namespace mixtrain
