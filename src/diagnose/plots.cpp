#include "mixtrain/diagnose/plots.h"

#include "mixtrain/util/svg_plot.h"

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

std::string loss_curves_svg(const Evidence& e, const std::vector<Trial>& trials) {
  std::vector<PlotSeries> series;
  // The mixed run is dashed: in a healthy run it lies on the fp32 line and would hide it.
  auto add = [&](const RunEvidence& r, const std::string& color, const std::string& faint, bool dashed) {
    series.push_back({"", steps_axis(r.losses.size()), r.losses, faint, true, false, dashed});
    series.push_back({r.precision + " (smoothed)" + (dashed ? ", dashed" : ""), steps_axis(r.smooth_losses.size()),
                      r.smooth_losses, color, true, false, dashed});
  };
  if (e.fp32) add(*e.fp32, "#1f77b4", "#c6dbef", false);
  if (e.mixed) add(*e.mixed, "#ff7f0e", "#fdd0a2", true);
  // Trials are dashed too: a proven one lies on the fp32 line and would hide it.
  static const char* kTrialColors[] = {"#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"};
  for (size_t i = 0; i < trials.size(); ++i)
    series.push_back({"trial " + std::to_string(i + 1) + ": " + trials[i].fix.str() + (trials[i].proven() ? " (proven)" : "") +
                          ", dashed",
                      steps_axis(trials[i].run.smooth_losses.size()), trials[i].run.smooth_losses, kTrialColors[i % 6], true,
                      false, true});
  std::string title = "Training loss: fp32 vs " + (e.mixed ? e.mixed->precision : std::string("mixed precision"));
  if (auto gap = e.gap_percent()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " (final gap %+.3g%%)", *gap);  // three significant digits, as the report
    title += buf;
  }
  PlotOptions o{title, "step (faint lines: per-batch loss; dotted: epoch boundaries)", "loss", false};
  o.log10_y_when_wide = true;
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

namespace {
std::vector<double> step_column(const Recorder& r, double StepRecord::*field) {
  std::vector<double> v;
  for (const auto& s : r.steps()) v.push_back(s.*field);
  return v;
}

std::vector<double> epoch_boundaries(const Recorder& r) {
  std::vector<double> lines;
  const auto& steps = r.steps();
  for (size_t i = 1; i < steps.size(); ++i)
    if (steps[i].epoch != steps[i - 1].epoch) lines.push_back(static_cast<double>(i) - 0.5);
  return lines;
}

/// Two SVG documents stacked in one (nested <svg> elements, one above the other).
std::string stack(const std::string& top, const std::string& bottom, int width, int height) {
  const auto body = [](const std::string& s) { return s.substr(s.find('>') + 1, s.rfind("</svg>") - s.find('>') - 1); };
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
         std::to_string(2 * height) + "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n<svg y=\"0\" width=\"" + std::to_string(width) + "\" height=\"" +
         std::to_string(height) + "\">" + body(top) + "</svg>\n<svg y=\"" + std::to_string(height) + "\" width=\"" +
         std::to_string(width) + "\" height=\"" + std::to_string(height) + "\">" + body(bottom) + "</svg>\n</svg>\n";
}
} // namespace

std::string plot_loss(const Recorder& r) {
  const auto x = steps_axis(r.steps().size());
  std::vector<PlotSeries> series{{"", x, step_column(r, &StepRecord::loss), "#c6dbef", true, false, false},
                                 {"train loss (smoothed)", x, step_column(r, &StepRecord::smooth_loss), "#1f77b4"}};
  // Validation loss at the last step of each epoch.
  PlotSeries valid{"valid loss (per epoch)", {}, {}, "#ff7f0e", true, true, true};
  int64_t step_end = 0;
  for (const auto& e : r.values()) {
    step_end += e.steps;
    valid.x.push_back(static_cast<double>(step_end - 1));
    valid.y.push_back(e.valid_loss);
  }
  if (!valid.x.empty()) series.push_back(valid);
  PlotOptions o{"Loss", "step (faint: per-batch loss; dotted: epoch boundaries)", "loss"};
  o.vlines = epoch_boundaries(r);
  o.log10_y_when_wide = true;
  return line_plot_svg(series, o);
}

std::string plot_sched(const Recorder& r) {
  const auto x = steps_axis(r.steps().size());
  PlotOptions lr{"Learning rate", "step", "lr"}, mom{"Momentum (beta1 for Adam)", "step", "momentum"};
  lr.vlines = mom.vlines = epoch_boundaries(r);
  const std::string top = line_plot_svg({{"lr", x, step_column(r, &StepRecord::lr), "#1f77b4"}}, lr);
  const std::string bottom = line_plot_svg({{"momentum", x, step_column(r, &StepRecord::mom), "#2ca02c"}}, mom);
  return stack(top, bottom, lr.width, lr.height);
}

std::string plot_scale(const Recorder& r) {
  RunEvidence run;
  for (const auto& s : r.steps()) {
    if (!std::isfinite(s.scale)) continue;
    run.scales.push_back(s.scale);
    run.skipped.push_back(s.skipped);
  }
  if (run.scales.empty()) return "";
  run.precision = "this run";
  return scale_history_svg(run);
}

} // namespace mixtrain::diagnose
