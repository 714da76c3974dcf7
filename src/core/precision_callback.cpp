// What PrecisionCallback's lost-update counts mean (mixtrain/core/precision_callback.h),
// in the words every report uses.
#include "mixtrain/core/precision_callback.h"

#include <string>

namespace mixtrain {

std::string lost_updates_meaning(const std::string& rule) {
  const std::string counted =
      "fraction: the element updates (nonzero in fp32) that left their bf16 weight unchanged in their own step; "
      "norm_ratio: |what that step's rounding changed| / |the updates intended|";
  if (rule == "stochastic")
    return counted + ". Under stochastic rounding none is lost: each rounds up with a probability in proportion to "
                     "its size, so the weight takes it in expectation, and a norm_ratio near 1 is that rounding's "
                     "unbiased noise";
  if (rule == "kahan")
    return counted + ". Under Kahan none is lost: the compensation carries what a step's rounding dropped into the "
                     "next steps";
  return counted + ". Under nearest rounding these updates are lost for good";
}

} // namespace mixtrain
