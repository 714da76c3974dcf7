#include "mixtrain/util/svg_plot.h"

#include "util/short_number.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace mixtrain {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

} // namespace

std::vector<double> nice_ticks(double lo, double hi, int target_count) {
  std::vector<double> ticks;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return ticks;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) return {lo};
  const double raw = (hi - lo) / std::max(1, target_count);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  // k * step rather than a running sum, so errors do not accumulate.
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) ticks.push_back(k * step + 0.0);  // + 0.0: no "-0" label
  return ticks;
}

namespace {
/// Whether every finite y is positive and the largest is at least 10^4 times the smallest.
bool spans_four_decades(const std::vector<PlotSeries>& series) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const auto& s : series)
    for (double y : s.y) {
      if (!std::isfinite(y)) continue;
      if (y <= 0) return false;
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
  return std::isfinite(lo) && hi >= 1e4 * lo;
}
} // namespace

std::string line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  PlotOptions o = options;
  const bool log10_y = !o.log2_y && o.log10_y_when_wide && spans_four_decades(series);
  // The legend sits right of the frame, where it can never hide a line; it is as wide as its
  // longest label (12 px text: about 7 px a character), and the chart widens with it.
  size_t longest = 0;
  for (const auto& s : series) longest = std::max(longest, s.label.size());
  const double legend = longest > 0 ? std::max(200.0, 44.0 + 7.0 * static_cast<double>(longest)) : 20;
  o.width = static_cast<int>(std::max<double>(o.width, o.width - 200 + legend));
  const double left = 78, right = legend, top = 40, bottom = 58;
  const double pw = o.width - left - right, ph = o.height - top - bottom;
  auto ty = [&](double y) { return o.log2_y ? std::log2(y) : log10_y ? std::log10(y) : y; };
  auto tx = [&](double x) { return o.log10_x ? std::log10(x) : x; };
  auto usable = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!(o.log2_y || log10_y) || y > 0) && (!o.log10_x || x > 0);
  };

  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (usable(s.x[i], s.y[i])) {
        x0 = std::min(x0, tx(s.x[i]));
        x1 = std::max(x1, tx(s.x[i]));
        y0 = std::min(y0, ty(s.y[i]));
        y1 = std::max(y1, ty(s.y[i]));
      }
  const bool empty = !std::isfinite(x0);
  if (empty) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (o.log10_x) x0 = std::floor(x0), x1 = std::ceil(x1);  // whole decades
  if (o.log2_y || log10_y) {
    // Whole powers of two (ten) around the data, at least two of them, so the axis always has ticks.
    y0 = std::floor(y0);
    y1 = std::ceil(y1);
    if (y1 - y0 < 2) y0 -= 1, y1 += 1;
  } else {
    if (y1 == y0) y0 -= 0.5, y1 += 0.5;
    const double ypad = (y1 - y0) * 0.05;
    y0 -= ypad;
    y1 += ypad;
  }
  auto px = [&](double x) { return left + (tx(x) - x0) / (x1 - x0) * pw; };
  auto px_raw = [&](double v) { return left + (v - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + (1 - (ty(y) - y0) / (y1 - y0)) * ph; };
  auto py_raw = [&](double v) { return top + (1 - (v - y0) / (y1 - y0)) * ph; };

  std::ostringstream svg;
  svg.precision(6);
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << o.width << "\" height=\"" << o.height
      << "\" viewBox=\"0 0 " << o.width << " " << o.height << "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << o.width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">"
      << escape(o.title) << "</text>\n";

  // Grid and ticks.
  std::vector<double> xticks;
  if (o.log10_x)
    for (double k = x0; k <= x1; k += 1) xticks.push_back(k);
  else
    xticks = nice_ticks(x0, x1);
  for (double t : xticks) {
    if (t < x0 || t > x1) continue;
    svg << "<line x1=\"" << px_raw(t) << "\" y1=\"" << top << "\" x2=\"" << px_raw(t) << "\" y2=\"" << top + ph
        << "\" stroke=\"#e5e5e5\"/>\n";
    svg << "<text x=\"" << px_raw(t) << "\" y=\"" << top + ph + 18 << "\" text-anchor=\"middle\" font-size=\"12\">"
        << (o.log10_x ? "1e" + std::to_string(static_cast<int>(t)) : detail::short_number(t)) << "</text>\n";
  }
  std::vector<double> yticks;
  if (o.log2_y || log10_y) {
    const int lo = static_cast<int>(std::ceil(y0)), hi = static_cast<int>(std::floor(y1));
    const int stride = std::max(1, (hi - lo) / 6 + 1);
    for (int k = lo; k <= hi; k += stride) yticks.push_back(k);
  } else {
    yticks = nice_ticks(y0, y1);
  }
  for (double t : yticks) {
    if (t < y0 || t > y1) continue;
    svg << "<line x1=\"" << left << "\" y1=\"" << py_raw(t) << "\" x2=\"" << left + pw << "\" y2=\"" << py_raw(t)
        << "\" stroke=\"#e5e5e5\"/>\n";
    svg << "<text x=\"" << left - 6 << "\" y=\"" << py_raw(t) + 4 << "\" text-anchor=\"end\" font-size=\"12\">"
        << (o.log2_y    ? "2^" + std::to_string(static_cast<int>(t))
            : log10_y ? "1e" + std::to_string(static_cast<int>(t))
                      : detail::short_number(t))
        << "</text>\n";
  }
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
  svg << "<text x=\"" << left + pw / 2 << "\" y=\"" << o.height - 14 << "\" text-anchor=\"middle\" font-size=\"13\">"
      << escape(o.x_label) << "</text>\n";
  svg << "<text x=\"16\" y=\"" << top + ph / 2 << "\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 16 "
      << top + ph / 2 << ")\">" << escape(o.y_label + (log10_y ? " (log scale)" : "")) << "</text>\n";
  if (empty)
    svg << "<text x=\"" << left + pw / 2 << "\" y=\"" << top + ph / 2 << "\" text-anchor=\"middle\" font-size=\"14\" "
        << "fill=\"#888\">no data</text>\n";

  // Vertical guides (epoch boundaries) under the series.
  for (double v : o.vlines)
    if (std::isfinite(v) && (!o.log10_x || v > 0) && tx(v) >= x0 && tx(v) <= x1)
      svg << "<line x1=\"" << px(v) << "\" y1=\"" << top << "\" x2=\"" << px(v) << "\" y2=\"" << top + ph
          << "\" stroke=\"#999\" stroke-width=\"1\" stroke-dasharray=\"2,3\"/>\n";

  // Series: polylines broken at unusable points, then markers.
  for (const auto& s : series) {
    const size_t n = std::min(s.x.size(), s.y.size());
    if (s.line) {
      std::ostringstream pts;
      pts.precision(6);
      size_t in_run = 0;
      auto flush = [&] {
        if (in_run > 1)
          svg << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.6\""
              << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << " points=\"" << pts.str() << "\"/>\n";
        pts.str("");
        in_run = 0;
      };
      for (size_t i = 0; i < n; ++i) {
        if (!usable(s.x[i], s.y[i])) {
          flush();
          continue;
        }
        pts << px(s.x[i]) << "," << py(s.y[i]) << " ";
        ++in_run;
      }
      flush();
    }
    if (s.markers)
      for (size_t i = 0; i < n; ++i)
        if (usable(s.x[i], s.y[i]))
          svg << "<circle cx=\"" << px(s.x[i]) << "\" cy=\"" << py(s.y[i]) << "\" r=\"3\" fill=\"" << s.color
              << "\"/>\n";
  }

  // Legend, right of the frame.
  double ly = top + 16;
  for (const auto& s : series) {
    if (s.label.empty()) continue;
    const double lx = left + pw + 12;
    if (s.line)
      svg << "<line x1=\"" << lx << "\" y1=\"" << ly - 4 << "\" x2=\"" << lx + 22 << "\" y2=\"" << ly - 4
          << "\" stroke=\"" << s.color << "\" stroke-width=\"2\"/>\n";
    if (s.markers) svg << "<circle cx=\"" << lx + 11 << "\" cy=\"" << ly - 4 << "\" r=\"3\" fill=\"" << s.color << "\"/>\n";
    svg << "<text x=\"" << lx + 28 << "\" y=\"" << ly << "\" font-size=\"12\">" << escape(s.label) << "</text>\n";
    ly += 18;
  }
  svg << "</svg>\n";
  return svg.str();
}

} // namespace mixtrain
