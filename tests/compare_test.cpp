// The A/B protocol end to end on deliberately broken user-defined models: each
// verdict must come from what the two runs measured.
#include "test_util.h"

#include <mixtrain/diagnose/trial_stop.h>
#include <mixtrain/mixtrain.h>

#include <nlohmann/json.hpp>

namespace {

using namespace mixtrain;
using mixtrain::test::contains;
namespace nn = torch::nn;

/// A small user-defined classifier: stem -> block(fc1, fc2) -> head.
struct ClassifierImpl : nn::Module {
  explicit ClassifierImpl(int64_t in = 4)
      : stem(register_module("stem", nn::Linear(in, 16))),
        fc1(register_module("fc1", nn::Linear(16, 16))),
        fc2(register_module("fc2", nn::Linear(16, 16))),
        head(register_module("head", nn::Linear(16, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(stem(x));
    x = torch::relu(fc2(torch::relu(fc1(x))));
    return head(x);
  }
  nn::Linear stem, fc1, fc2, head;
};
TORCH_MODULE(Classifier);

struct Scenario {
  data::Dataset train = test::blobs(256, 3, 4, 1);
  data::Dataset valid = test::blobs(128, 3, 4, 2);
  std::function<void(Classifier&)> tweak_model = [](Classifier&) {};
  LossFn loss = cross_entropy();
};

/// The doctor's options with its trials' settings applied through the option table, as run::doctor does.
diagnose::CompareOptions trial_options() { return diagnose::CompareOptions().apply_setting(run::apply_setting); }

diagnose::LearnerFactory factory(const Scenario& s) {
  return [s] {
    Classifier net;
    s.tweak_model(net);
    auto dls = data::DataLoaders::from_split({s.train, s.valid}, 16, /*seed=*/7);
    return std::make_unique<Learner>(Model(net), std::move(dls), s.loss, LearnerOptions().progress(false));
  };
}


class CompareTest : public test::SeededTest {};

TEST_F(CompareTest, HealthyModelIsHealthyWithIdenticalStartsAndData) {
  const auto d = diagnose::compare(factory(Scenario{}), trial_options().epochs(2).lr(1e-2));
  EXPECT_EQ(d.verdict, diagnose::Verdict::kHealthy) << d.report();
  const auto& e = d.evidence;
  ASSERT_TRUE(e.fp32 && e.mixed);
  EXPECT_EQ(e.fp32->losses.size(), 32u);
  EXPECT_EQ(e.mixed->losses.size(), 32u);
  // Same weights, same first batch: the first losses agree to fp16 rounding.
  EXPECT_NEAR(e.fp32->losses[0], e.mixed->losses[0], 2e-3);
  EXPECT_EQ(e.mixed->scale.skipped, 0);
  EXPECT_TRUE(e.mixed->emulated);
  EXPECT_LT(std::abs(*e.gap_percent()), 10.0);
  EXPECT_FALSE(e.trace_start->first_overflow.has_value());
  EXPECT_TRUE(d.trials.empty());  // a healthy model costs no trial
}

TEST_F(CompareTest, OverflowingLayerGivesForwardOverflowAndNamesIt) {
  Scenario s;
  s.tweak_model = [](Classifier& net) {
    torch::NoGradGuard g;
    net->fc1->weight.mul_(1e5);  // fc1's activations reach ~3e5
    net->fc2->weight.div_(1e5);  // and fc2 brings them back: fp32 trains fine
  };
  const auto d = diagnose::compare(factory(s), trial_options().epochs(1).lr(1e-2));
  EXPECT_EQ(d.verdict, diagnose::Verdict::kForwardOverflow) << d.report();
  ASSERT_TRUE(d.evidence.trace_start && d.evidence.trace_start->first_overflow);
  EXPECT_EQ(d.evidence.trace_start->first_overflow->module, "fc1");
  EXPECT_GT(d.evidence.trace_start->first_overflow->max_abs, diagnose::kFp16Max);
  EXPECT_NE(d.headline.find("fc1 (aten::addmm)"), std::string::npos) << d.headline;
  EXPECT_GT(d.evidence.mixed->scale.nonfinite_losses, 0);
  EXPECT_EQ(d.evidence.fp32->scale.nonfinite_losses, 0);
  // The doctor tries its fixes: fc1 in fp32 still overflows, at fc2 (fc1's fp32 output
  // is rounded to half there), so the next trial keeps both; that one is finite, but
  // the stem's gradients, coming back through fc1's huge weights, overflow fp16 (as
  // they would under real autocast): a gradient overflow. bf16 is what proves out.
  ASSERT_EQ(d.trials.size(), 3u) << d.report();
  EXPECT_EQ(d.trials[0].settings_in(api_words()), "PrecisionOptions().keep_fp32({\"fc1\"})");
  EXPECT_EQ(d.trials[0].verdict, diagnose::Verdict::kForwardOverflow) << d.report();
  EXPECT_EQ(d.trials[1].settings_in(api_words()), "PrecisionOptions().keep_fp32({\"fc1\", \"fc2\"})");
  EXPECT_TRUE(d.trials[1].finite) << d.report();
  EXPECT_EQ(d.trials[1].verdict, diagnose::Verdict::kGradientOverflow) << d.report();
  EXPECT_EQ(d.trials[2].settings_in(api_words()), "to_bf16()");
  EXPECT_TRUE(d.trials[2].proven()) << d.report();
  ASSERT_EQ(d.proven_fix, std::optional<size_t>(2));
  EXPECT_NE(d.report().find("proven fix: train in bf16"), std::string::npos) << d.report();
  const auto j = nlohmann::json::parse(d.to_json(run::flag_words()));
  EXPECT_EQ(j.at("proven_fix").at("flags"), "--precision bf16");
  EXPECT_EQ(j.at("proven_fix").at("api"), "to_bf16()");
  EXPECT_TRUE(j.at("proven_fix").at("gap_percent").is_number());
  EXPECT_EQ(j.at("trials").size(), 3u);
  EXPECT_LE(d.trials.size(), 4u);  // the default bound
  const auto none = diagnose::compare(factory(s), trial_options().epochs(1).lr(1e-2).max_trials(0));
  EXPECT_TRUE(none.trials.empty());
  EXPECT_FALSE(none.proven_fix.has_value());
  EXPECT_TRUE(nlohmann::json::parse(none.to_json()).at("proven_fix").is_null());
  EXPECT_NE(none.report().find("fixes, in order"), std::string::npos);
}

TEST_F(CompareTest, AFixWhoseTrialFailedIsNotRecommended) {
  // fc1 overflows fp16; of its fixes, bf16 is one. Here the bf16 trial cannot run
  // (a model that cannot take it): the report must not still recommend bf16.
  Scenario s;
  s.tweak_model = [](Classifier& net) {
    torch::NoGradGuard g;
    net->fc1->weight.mul_(1e5);
    net->fc2->weight.div_(1e5);
  };
  auto options = trial_options().epochs(1).lr(1e-2);
  options.apply_setting([](const diagnose::Setting& st, diagnose::MixedRun& run) {
    if (st.key == "precision" && st.value == "bf16") throw std::runtime_error("this model cannot take bf16");
    run::apply_setting(st, run);
  });
  // What the doctor keeps as it goes (diagnosis.json): the verdict before any trial,
  // then one more trial as each ends, the failed fix already withdrawn.
  std::vector<diagnose::Diagnosis> kept;
  options.on_progress([&](const diagnose::Diagnosis& now) { kept.push_back(now); });
  const auto d = diagnose::compare(factory(s), options);
  EXPECT_EQ(d.verdict, diagnose::Verdict::kForwardOverflow) << d.report();
  ASSERT_EQ(kept.size(), d.trials.size() + 1) << d.report();
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].verdict, d.verdict);
    EXPECT_EQ(kept[i].trials.size(), i);
    EXPECT_EQ(kept[i].trials_status, "running");
  }
  EXPECT_EQ(d.trials_status, "done");
  EXPECT_EQ(nlohmann::json::parse(kept.back().to_json()).at("trials_status"), "running");
  EXPECT_EQ(kept.back().fixes.size(), d.fixes.size()) << kept.back().report();
  const auto bf16 = std::find_if(d.trials.begin(), d.trials.end(), [](const diagnose::Trial& t) {
    return !t.settings.empty() && t.settings[0].value == "bf16";
  });
  ASSERT_NE(bf16, d.trials.end()) << d.report();
  EXPECT_EQ(bf16->error, "this model cannot take bf16");
  for (const auto& fix : d.fixes) EXPECT_FALSE(fix.names_setting("precision", "bf16")) << fix.str();
  EXPECT_FALSE(d.fixes.empty()) << d.report();  // the islands are still recommended
  EXPECT_TRUE(contains(d.findings, "its trial failed on this model: this model cannot take bf16")) << d.report();
}

TEST_F(CompareTest, TinyLossScaleGivesUnderflow) {
  // The loss scale 2^-20: scaled gradients fall below fp16's smallest subnormal.
  const auto d = diagnose::compare(
      factory(Scenario{}),
      trial_options().epochs(2).lr(1e-2).precision_options(PrecisionOptions().scaler(amp::GradScalerOptions().init_scale(std::ldexp(1.0, -20)))));
  EXPECT_EQ(d.verdict, diagnose::Verdict::kUnderflow) << d.report();
  ASSERT_TRUE(d.evidence.gradients);
  EXPECT_GT(d.evidence.gradients->underflow, 0.5);
  EXPECT_GT(*d.evidence.gap_percent(), 10.0);
  EXPECT_TRUE(contains(d.findings, "flush to zero"));
  EXPECT_EQ(d.evidence.mixed->scale.skipped, 0);  // nothing overflowed: it just learned nothing
}

TEST_F(CompareTest, GradientsOverflowingOnMostStepsGiveGradientOverflow) {
  // A custom loss weighted 1e8: harmless in fp32 (AdamW is scale-invariant), but
  // its gradients exceed 65504 until the scale has backed off ~2^22.
  Scenario s;
  s.loss = [](const torch::Tensor& pred, const torch::Tensor& y) { return torch::nn::functional::cross_entropy(pred, y) * 1e8; };
  const auto d = diagnose::compare(factory(s), trial_options().epochs(2).lr(1e-2));
  EXPECT_EQ(d.verdict, diagnose::Verdict::kGradientOverflow) << d.report();
  const auto& sc = d.evidence.mixed->scale;
  EXPECT_TRUE(sc.collapsed);
  EXPECT_LE(sc.min_scale, 1.0);
  EXPECT_GT(sc.skip_rate, 0.3);
  EXPECT_TRUE(contains(d.findings, "steps skipped"));
  EXPECT_TRUE(contains(d.findings, "collapsed"));
  EXPECT_FALSE(d.evidence.trace_start->first_overflow.has_value());  // the forward pass is fine
}

TEST_F(CompareTest, NanInTheDataIsBrokenInFp32WithAnInputFinding) {
  Scenario s;
  s.train.x = s.train.x.clone();
  s.train.x.slice(0, 0, 256, 10).select(1, 0).fill_(NAN);  // every 10th sample
  const auto d = diagnose::compare(factory(s), trial_options().epochs(1).lr(1e-2));
  EXPECT_EQ(d.verdict, diagnose::Verdict::kBrokenInFp32) << d.report();
  EXPECT_TRUE(contains(d.findings, "26 of 1024 input values are NaN or Inf"));
  EXPECT_TRUE(contains(d.fixes, "remove or impute"));
}

TEST_F(CompareTest, RawPixelInputsAreFlaggedInTheEvidence) {
  Scenario s;
  s.train.x = (s.train.x * 40 + 128).round().clamp(0, 255);  // 0-255 integers, as raw pixels
  s.valid.x = (s.valid.x * 40 + 128).round().clamp(0, 255);
  const auto d = diagnose::compare(factory(s), trial_options().epochs(1).lr(1e-3));
  ASSERT_TRUE(d.evidence.inputs);
  EXPECT_TRUE(d.evidence.inputs->raw_pixels);
  EXPECT_TRUE(contains(d.findings, "raw 0-255 pixels")) << d.report();
  const auto j = nlohmann::json::parse(d.to_json());
  EXPECT_TRUE(j.at("evidence").at("inputs").at("raw_pixels").get<bool>());
}

TEST_F(CompareTest, Fp16WithEmulationForbiddenIsUnsupported) {
  const auto d = diagnose::compare(factory(Scenario{}), trial_options().precision_options(PrecisionOptions().allow_fp16_emulation(false)));
  EXPECT_EQ(d.verdict, diagnose::Verdict::kUnsupported);
  EXPECT_FALSE(d.evidence.fp32.has_value());  // nothing was trained
  EXPECT_TRUE(contains(d.fixes, "bf16"));
}

} // namespace

namespace {
/// A trial that ended, proven or not, at `bytes` a parameter.
diagnose::Trial trial_at(double bytes, bool proven) {
  diagnose::Trial t;
  t.fix = Phrase("a fix");
  t.run.bytes_per_param = bytes;
  t.verdict = proven ? diagnose::Verdict::kHealthy : diagnose::Verdict::kLostUpdates;
  return t;
}
diagnose::Fix waiting_fix(double min_extra_bytes) { return {Phrase("waiting"), {{"weight_update", "kahan"}}, min_extra_bytes}; }
} // namespace

// The trials stop at a proven fix only when no waiting fix can be cheaper: each costs at
// least the run under diagnosis plus its known extra. bf16-pure's run here costs 8 bytes
// a parameter (bf16 weights, gradients and AdamW's two moments).
TEST(TrialStopTest, StopsOnlyWhenNoWaitingFixCanBeCheaper) {
  using diagnose::why_trials_stop;
  // A cure at the run's own cost: nothing can undercut it.
  const std::string at_floor = why_trials_stop(trial_at(8, true), 8, {waiting_fix(2), waiting_fix(4)});
  EXPECT_EQ(at_floor, "the proven fix costs 8 bytes a parameter: none of the 2 fix(es) still waiting could be cheaper");
  // An island proven at 8.1 with Kahan (at least 10) and the masters (12) waiting: stop.
  EXPECT_FALSE(why_trials_stop(trial_at(8.1, true), 8, {waiting_fix(2), waiting_fix(4)}).empty());
  // Kahan proven at 10 with a small island (at least 8.5) still waiting: it could be cheaper.
  EXPECT_EQ(why_trials_stop(trial_at(10, true), 8, {waiting_fix(0.5), waiting_fix(4)}), "");
  // A waiting fix of unknown cost (0 extra) may cost what the run does: a dearer proof goes on.
  EXPECT_EQ(why_trials_stop(trial_at(8.1, true), 8, {waiting_fix(4), waiting_fix(0)}), "");
  // Exactly as cheap is not cheaper: the first proven of equal cost stands.
  EXPECT_FALSE(why_trials_stop(trial_at(10, true), 8, {waiting_fix(2)}).empty());
  // Nothing proven, nothing waiting, or a cost unknown: the trials go on (or end by themselves).
  EXPECT_EQ(why_trials_stop(trial_at(8, false), 8, {waiting_fix(2)}), "");
  EXPECT_EQ(why_trials_stop(trial_at(8, true), 8, {}), "");
  EXPECT_EQ(why_trials_stop(trial_at(8, true), NAN, {waiting_fix(2)}), "");
  EXPECT_EQ(why_trials_stop(trial_at(NAN, true), 8, {waiting_fix(2)}), "");
}
