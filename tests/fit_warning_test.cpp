// FitWarning judged by the watch's rule: a fit's scale history and lost-update counts are the
// evidence a watched loop records (diagnose::fit_evidence), diagnose::judge_watch gives the
// verdict for both, and the line a fit ends with leads with it and its cure. Below a verdict,
// the facts (scale_analysis_test.cpp) are still said.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

namespace {

using namespace mixtrain;
class FitWarningTest : public test::SeededTest {};

std::unique_ptr<Learner> warned_linear() {
  auto ds = test::blobs(160, 3, 4);
  auto dls = data::DataLoaders(data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)),
                               data::DataLoader(ds, data::DataLoaderOptions().batch_size(16)));
  auto learn = std::make_unique<Learner>(Model(torch::nn::Linear(4, 3)), std::move(dls), cross_entropy(),
                                         LearnerOptions().progress(false));
  learn->add_cb(std::make_shared<diagnose::FitWarning>());  // the run layer attaches it for fp16 and bf16-pure
  return learn;
}

TEST_F(FitWarningTest, AFitsEvidenceIsTheScaleAfterEachUpdateAsAWatchRecordsIt) {
  auto learn = warned_linear();
  learn->to_fp16(amp::GradScalerOptions().init_scale(256));
  learn->fit(1, 1e-2, {std::make_shared<test::InjectOverflow>(std::set<int64_t>{3, 4, 6, 8})});
  const diagnose::WatchEvidence e = diagnose::fit_evidence(learn->recorder().steps(), learn->precision_cb().get());
  EXPECT_EQ(e.steps, 10);
  EXPECT_EQ(e.initial_scale, 256);
  // Each overflow halves the scale the next step uses; the last entry is the scaler's own.
  EXPECT_EQ(e.scales, (std::vector<double>{256, 256, 256, 128, 64, 64, 32, 32, 16, 16}));
  EXPECT_EQ(diagnose::watch_skips(e).steps, (std::vector<int64_t>{3, 4, 6, 8}));
  EXPECT_TRUE(e.lost.empty());  // fp16 under autocast keeps fp32 weights: nothing rounded
  // 40% skipped after no settling: below the watch's verdict, a fact the fit still says.
  EXPECT_EQ(diagnose::judge_watch(e).verdict, "healthy");
  const std::string w = learn->get_cb<diagnose::FitWarning>()->message().str();
  EXPECT_EQ(w.rfind("4 of 10 steps (40%) were skipped", 0), 0u) << w;
}

TEST_F(FitWarningTest, ACollapsedScaleEndsTheFitWithTheWatchsGradientOverflowAndItsCure) {
  auto learn = warned_linear();
  learn->to_fp16(amp::GradScalerOptions().init_scale(256));
  std::set<int64_t> every_step;
  for (int64_t i = 2; i < 20; ++i) every_step.insert(i);  // 256 / 2^9 < 1 after nine back-offs
  learn->fit(2, 1e-2, {std::make_shared<test::InjectOverflow>(every_step)});
  const std::string w = learn->get_cb<diagnose::FitWarning>()->message().str();
  EXPECT_EQ(w.rfind("gradient_overflow: the loss scale collapsed: repeated back-off from 256 down to", 0), 0u) << w;
  EXPECT_NE(w.find("the cure to try first: " + Phrase::setting("clip", "1").str() + " or " +
                   Phrase::setting("precision", "bf16").str()),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("proves it"), std::string::npos) << w;
  EXPECT_EQ(w.find('\n'), std::string::npos) << w;
}

TEST_F(FitWarningTest, Bf16PureNearestLosingMostUpdatesIsTheWatchsLostUpdatesAndStochasticIsQuiet) {
  const auto fit = [](amp::WeightUpdate rule, double lr) {
    torch::manual_seed(0);
    test::NormMlp net;
    auto dls = data::DataLoaders::from_split({test::blobs(512, 3, 8, 3), test::blobs(128, 3, 8, 4)}, 32, 11);
    auto learn = std::make_unique<Learner>(Model(net), std::move(dls), cross_entropy(), LearnerOptions().progress(false));
    learn->add_cb(std::make_shared<diagnose::FitWarning>());
    learn->set_precision(Precision::kBf16Pure, PrecisionOptions().weight_update(rule).rounding_seed(42));
    learn->fit(1, lr);
    return learn;
  };
  const auto nearest = fit(amp::WeightUpdate::kNearest, 1e-5);
  const diagnose::WatchEvidence e = diagnose::fit_evidence(nearest->recorder().steps(), nearest->precision_cb().get());
  const auto lost = nearest->precision_cb()->lost_updates();
  ASSERT_TRUE(lost);
  // The evidence holds every 16-bit parameter's exact counts, which sum to the report's.
  int64_t intended = 0, lost_count = 0;
  for (const auto& c : e.lost) {
    intended += c.intended;
    lost_count += c.lost;
  }
  EXPECT_EQ(intended, lost->intended);
  EXPECT_EQ(lost_count, lost->lost);
  EXPECT_TRUE(e.scales.empty());  // bf16 scales no loss
  ASSERT_GE(lost->fraction, diagnose::kLostUpdatesMost);
  const std::string w = nearest->get_cb<diagnose::FitWarning>()->message().str();
  EXPECT_EQ(w.rfind("lost_updates: ", 0), 0u) << w;
  EXPECT_NE(w.find("norm.weight 100%"), std::string::npos) << w;  // the LayerNorm gain never moves
  EXPECT_NE(w.find(Phrase::setting("weight_update", "stochastic").str()), std::string::npos) << w;
  // Stochastic rounding keeps what single steps drop: no verdict, and no fact worth a line.
  const auto stochastic = fit(amp::WeightUpdate::kStochastic, 1e-5);
  EXPECT_EQ(stochastic->get_cb<diagnose::FitWarning>()->message().str(), "");
}

} // namespace
