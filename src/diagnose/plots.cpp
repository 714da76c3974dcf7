#include "mixtrain/diagnose/plots.h"

#include "mixtrain/diagnose/svg_plot.h"

#include <cmath>
#include <limits>

namespace mixtrain::diagnose {

namespace {
std::vector<double> steps_axis(size_t n) {
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i);
  return x;
}
} // namespace

std::string loss_curves_svg(const Evidence& e) {
  std::vector<PlotSeries> series;
  // The mixed run is dashed: in a healthy run it lies on the fp32 line and would hide it.
  auto add = [&](const RunEvidence& r, const std::string& color, const std::string& faint, bool dashed) {
    series.push_back({"", steps_axis(r.losses.size()), r.losses, faint, true, false, dashed});
    series.push_back({r.precision + " (smoothed)" + (dashed ? ", dashed" : ""), steps_axis(r.smooth_losses.size()),
                      r.smooth_losses, color, true, false, dashed});
  };
  if (e.fp32) add(*e.fp32, "#1f77b4", "#c6dbef", false);
  if (e.mixed) add(*e.mixed, "#ff7f0e", "#fdd0a2", true);
  std::string title = "Training loss: fp32 vs " + (e.mixed ? e.mixed->precision : std::string("mixed precision"));
  if (auto gap = e.gap_percent()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " (final gap %+.3g%%)", *gap);  // three significant digits, as the report
    title += buf;
  }
  PlotOptions o{title, "step (faint lines: per-batch loss; dotted: epoch boundaries)", "loss", false};
  const RunEvidence* r = e.fp32 ? &*e.fp32 : e.mixed ? &*e.mixed : nullptr;
  if (r)
    for (size_t i = 1; i < r->epochs.size(); ++i)
      if (r->epochs[i] != r->epochs[i - 1]) o.vlines.push_back(static_cast<double>(i) - 0.5);
  return line_plot_svg(series, o);
}

std::string scale_history_svg(const RunEvidence& r) {
  const auto x = steps_axis(r.scales.size());
  std::vector<double> skipped_y(r.scales.size(), std::numeric_limits<double>::quiet_NaN());
  int64_t n_skipped = 0;
  for (size_t i = 0; i < r.scales.size(); ++i)
    if (r.skipped[i]) {
      skipped_y[i] = r.scales[i];
      ++n_skipped;
    }
  std::vector<PlotSeries> series{
      {"loss scale", x, r.scales, "#2ca02c", true, false, false},
      {"skipped step (" + std::to_string(n_skipped) + ")", x, skipped_y, "#d62728", false, true, false}};
  return line_plot_svg(series, {"Loss-scale history (" + r.precision + ")", "step", "loss scale", true});
}

} // namespace mixtrain::diagnose
