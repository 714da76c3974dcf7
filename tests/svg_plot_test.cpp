// The SVG writer behind the doctor's charts: ticks, NaN gaps, log2 axis, escaping.
#include "test_util.h"

#include <mixtrain/diagnose/plots.h>
#include <mixtrain/util/svg_plot.h>

#include <regex>

namespace {

using namespace mixtrain;
using namespace mixtrain::diagnose;

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

void expect_ticks(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
}

TEST(SvgPlotTest, NiceTicksUseOneTwoFiveSteps) {
  expect_ticks(nice_ticks(0, 1, 5), {0, 0.2, 0.4, 0.6, 0.8, 1.0});
  expect_ticks(nice_ticks(0.3, 2.6, 5), {0.5, 1.0, 1.5, 2.0, 2.5});
  expect_ticks(nice_ticks(0, 230, 6), {0, 50, 100, 150, 200});
  EXPECT_EQ(nice_ticks(3, 3), std::vector<double>{3});
  EXPECT_TRUE(nice_ticks(NAN, 1).empty());
}

TEST(SvgPlotTest, WellFormedWithLegendAxesAndBrokenLines) {
  PlotSeries s{"fp16 <loss> & co", {0, 1, 2, 3, 4}, {1.0, 0.8, NAN, 0.5, 0.4}, "#ff7f0e", true, false};
  const std::string svg = line_plot_svg({s}, {"Title", "step", "loss", false});
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("fp16 &lt;loss&gt; &amp; co"), std::string::npos);  // escaped legend text
  EXPECT_EQ(svg.find("<loss>"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 2);  // the NaN splits the line
  EXPECT_EQ(count(svg, "<svg"), count(svg, "</svg>"));
  EXPECT_EQ(svg.find("nan"), std::string::npos);  // no NaN coordinates leak into the document
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(SvgPlotTest, Log2AxisTicksArePowersOfTwoAndMarkersAreDrawn) {
  PlotSeries scale{"scale", {0, 1, 2, 3}, {65536, 32768, 32768, 65536}, "#2ca02c", true, false};
  PlotSeries skips{"skipped", {0, 1, 2, 3}, {65536, NAN, NAN, NAN}, "#d62728", false, true};
  const std::string svg = line_plot_svg({scale, skips}, {"Scale", "step", "scale", true});
  EXPECT_NE(svg.find(">2^16<"), std::string::npos);
  EXPECT_NE(svg.find(">2^15<"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle") - 1, 1);  // one skip marker (+1 legend marker)
}

// A long legend label widens the chart rather than running past its edge (a trial's
// "trial 1: round the update stochastically (...)" was cut after 28 characters).
TEST(SvgPlotTest, ALongLegendWidensTheChartInsteadOfBeingCut) {
  const std::string label(90, 'x');
  const std::string svg = line_plot_svg({{label, {0, 1}, {1, 2}, "#000"}}, {"T", "x", "y", false});
  const std::smatch m = [&] {
    std::smatch r;
    std::regex_search(svg, r, std::regex("width=\"([0-9]+)\""));
    return r;
  }();
  const double width = std::stod(m[1]);
  std::smatch text;
  ASSERT_TRUE(std::regex_search(svg, text, std::regex("<text x=\"([0-9.]+)\" y=\"[0-9.]+\" font-size=\"12\">x{90}<")));
  EXPECT_GE(width, std::stod(text[1]) + 90 * 6.5) << "the legend runs past the chart's right edge";
  EXPECT_EQ(line_plot_svg({{"short", {0, 1}, {1, 2}, "#000"}}, {"T", "x", "y", false}).rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"880\"", 0),
            0u) << "a short legend keeps the default width";
}

// A loss that spans four decades gets a log axis where asked for; a narrower one does not.
TEST(SvgPlotTest, FourDecadesOfLossGetALogAxis) {
  PlotOptions o{"Loss", "step", "loss"};
  o.log10_y_when_wide = true;
  const std::string wide = line_plot_svg({{"loss", {0, 1, 2, 3}, {2000, 50, 1, 0.1}, "#000"}}, o);
  EXPECT_NE(wide.find(">1e3<"), std::string::npos);
  EXPECT_NE(wide.find(">1e-1<"), std::string::npos);
  EXPECT_NE(wide.find("loss (log scale)"), std::string::npos);
  const std::string narrow = line_plot_svg({{"loss", {0, 1, 2, 3}, {20, 5, 1, 0.1}, "#000"}}, o);
  EXPECT_EQ(narrow.find("log scale"), std::string::npos);
  o.log10_y_when_wide = false;
  EXPECT_EQ(line_plot_svg({{"loss", {0, 1, 2, 3}, {2000, 50, 1, 0.1}, "#000"}}, o).find("log scale"), std::string::npos);
}

TEST(SvgPlotTest, EmptyPlotSaysNoData) {
  const std::string svg = line_plot_svg({}, {"Nothing", "x", "y", false});
  EXPECT_NE(svg.find("no data"), std::string::npos);
}

TEST(SvgPlotTest, ScaleHistoryMarksEverySkippedStep) {
  RunEvidence r;
  r.precision = "fp16";
  r.scales = {65536, 32768, 32768, 16384, 16384};
  r.skipped = {true, false, true, false, false};
  const std::string svg = scale_history_svg(r);
  EXPECT_NE(svg.find("skipped step (2)"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 2 + 1);
}

} // namespace

namespace {

// The doctor's loss chart: the mixed line is dashed (it lies on the fp32 line in a
// healthy run), epochs are marked, and the title's gap has the report's precision.
TEST(LossChartTest, MixedLineIsDashedEpochsAreMarkedAndTheGapIsNotRoundedAway) {
  using namespace mixtrain;
using namespace mixtrain::diagnose;
  auto run = [](const std::string& p, double end) {
    RunEvidence r;
    r.precision = p;
    for (int i = 0; i < 12; ++i) {
      r.losses.push_back(2.0 - 0.1 * i);
      r.smooth_losses.push_back(2.0 - 0.1 * i);
      r.epochs.push_back(i / 4);
    }
    r.first_loss = 2.0;
    r.final_loss = r.valid_loss = end;
    return r;
  };
  Evidence e;
  e.fp32 = run("fp32", 0.5);
  e.mixed = run("fp16", 0.4998);  // -0.04%
  const std::string svg = loss_curves_svg(e);
  EXPECT_NE(svg.find("stroke-dasharray=\"6,4\""), std::string::npos);
  size_t guides = 0;
  for (size_t at = svg.find("stroke-dasharray=\"2,3\""); at != std::string::npos; at = svg.find("stroke-dasharray=\"2,3\"", at + 1))
    ++guides;
  EXPECT_EQ(guides, 2u);  // 3 epochs: 2 boundaries
  EXPECT_NE(svg.find("final gap -0.04%"), std::string::npos) << svg.substr(0, 600);
  // A proven trial lies on the fp32 line: dashed, it leaves fp32 visible.
  Trial t;
  t.fix = Phrase("round the update stochastically: unbiased, no extra memory");
  t.run = run("bf16-pure", 0.5);
  const std::string with_trial = loss_curves_svg(e, {t});
  EXPECT_EQ(count(with_trial, "stroke-dasharray=\"6,4\""), count(svg, "stroke-dasharray=\"6,4\"") + 1);
  EXPECT_NE(with_trial.find("no extra memory (proven), dashed<"), std::string::npos);
}

} // namespace
