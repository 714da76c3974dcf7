#include "mixtrain/diagnose/input_check.h"

#include "util/short_number.h"

#include <torch/torch.h>

#include <cmath>

namespace mixtrain::diagnose {

namespace {
constexpr double kMaxAbsMean = 3.0;
constexpr double kMaxStd = 10.0;
using detail::short_number;
} // namespace

InputReport check_inputs(const torch::Tensor& input) {
  InputReport r;
  if (!input.defined() || !input.is_floating_point() || input.numel() == 0) return r;
  torch::NoGradGuard no_grad;
  const torch::Tensor x = input.detach().to(torch::kDouble);
  r.numel = x.numel();
  const torch::Tensor finite_mask = torch::isfinite(x);
  r.nonfinite = r.numel - finite_mask.sum().item<int64_t>();
  const torch::Tensor finite = x.masked_select(finite_mask);
  if (r.nonfinite > 0)
    r.findings.push_back(std::to_string(r.nonfinite) + " of " + std::to_string(r.numel) +
                         " input values are NaN or Inf: clean or impute the data");
  if (finite.numel() == 0) return r;
  r.mean = finite.mean().item<double>();
  r.std = finite.numel() > 1 ? finite.std().item<double>() : 0.0;
  r.min = finite.min().item<double>();
  r.max = finite.max().item<double>();
  r.integer_valued = finite.eq(finite.round()).all().item<bool>();
  r.raw_pixels = r.integer_valued && r.min >= 0 && r.max > 1.5 && r.max <= 255;

  if (r.raw_pixels) {
    r.unnormalized = true;
    r.findings.push_back("inputs look like raw 0-255 pixels (integers from " + short_number(r.min) + " to " + short_number(r.max) +
                         "): divide by 255 and normalize to mean 0, std 1");
  } else if (x.dim() != 2 && (std::abs(r.mean) > kMaxAbsMean || r.std > kMaxStd)) {
    r.unnormalized = true;
    r.findings.push_back("inputs are not normalized (mean " + short_number(r.mean) + ", std " + short_number(r.std) +
                         "; expected about 0 and 1): standardize them");
  }
  if (!r.unnormalized && x.dim() == 2 && x.size(0) > 1) {
    // Tabular data is judged per feature: one unscaled column is enough to
    // overflow a linear layer in fp16, and naming it says what to fix.
    const torch::Tensor cols = torch::where(finite_mask, x, torch::zeros({}, x.options()));
    const torch::Tensor mean = cols.mean(0), std = cols.std(0);
    const torch::Tensor bad = (mean.abs() > kMaxAbsMean).logical_or(std > kMaxStd).nonzero().flatten();
    if (bad.numel() > 0) {
      r.unnormalized = true;
      std::string list;
      for (int64_t i = 0; i < std::min<int64_t>(bad.numel(), 3); ++i) {
        const int64_t c = bad[i].item<int64_t>();
        list += (i ? ", " : "") + std::string("feature ") + std::to_string(c) + " (mean " +
                short_number(mean[c].item<double>()) + ", std " + short_number(std[c].item<double>()) + ")";
      }
      r.findings.push_back(std::to_string(bad.numel()) + " input feature(s) are not normalized: " + list +
                           (bad.numel() > 3 ? ", ..." : "") + ": standardize each feature");
    }
  }
  return r;
}

} // namespace mixtrain::diagnose
