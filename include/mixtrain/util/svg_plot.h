#pragma once
/// A small SVG line-plot writer for every chart mixtrain draws: run charts,
/// lr_find, the doctor's comparison (no plotting library
/// in Debian fits a C++ tool without pulling in Python or Qt).

#include <string>
#include <vector>

namespace mixtrain {

struct PlotSeries {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;       ///< NaN/Inf points are left out (the line breaks there)
  std::string color = "#1f77b4";
  bool line = true;            ///< draw a polyline through the points
  bool markers = false;        ///< draw a marker at each point
  bool dashed = false;         ///< a dashed line, so that a series drawn over another leaves it visible
};

struct PlotOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_y = false;  ///< logarithmic y axis with ticks at powers of two (loss scales)
  bool log10_x = false; ///< logarithmic x axis with ticks at powers of ten (learning rates)
  std::vector<double> vlines;  ///< x positions of thin vertical guides (epoch boundaries)
  int width = 880;             ///< at least: a long legend widens it, never cut at the edge
  int height = 380;
  /// A logarithmic y axis (ticks at powers of ten) when the values are all positive and span
  /// four decades or more (a loss from 1e3 to 0.1 is a flat line near zero on a linear axis).
  bool log10_y_when_wide = false;
};

/// The plot as a standalone SVG document. Axes get "nice" ticks (1-2-5 steps,
/// or powers of two on a log2 axis), a legend names every labelled series, and
/// text is XML-escaped. An empty plot (no finite point) still renders its frame
/// and says "no data".
std::string line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& options);

/// Tick positions covering [lo, hi] in 1-2-5 steps (exposed for tests).
std::vector<double> nice_ticks(double lo, double hi, int target_count = 6);

} // namespace mixtrain
