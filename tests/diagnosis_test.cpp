// The verdict rules on synthetic evidence: their order, their thresholds, fixes
// that follow the measurements, and the JSON.
#include "test_util.h"

#include <mixtrain/run/options.h>

#include <mixtrain/diagnose/diagnosis.h>

#include <nlohmann/json.hpp>

namespace {

using namespace mixtrain::diagnose;
using mixtrain::test::contains;

RunEvidence run_evidence(const std::string& precision, double first, double final_loss) {
  RunEvidence r;
  r.precision = precision;
  r.first_loss = first;
  r.final_loss = final_loss;
  r.valid_loss = final_loss;
  r.scale.steps = 100;
  return r;
}

Evidence healthy_pair() {
  Evidence e;
  e.fp32 = run_evidence("fp32", 2.3, 0.50);
  e.mixed = run_evidence("fp16", 2.3, 0.51);
  e.mixed->scale.has_scale = true;
  e.mixed->scale.initial_scale = e.mixed->scale.final_scale = e.mixed->scale.min_scale = 65536;
  return e;
}


TEST(DiagnosisTest, HealthyWhenTheGapIsSmallAndNothingSkips) {
  const Diagnosis d = decide(healthy_pair());
  EXPECT_EQ(d.verdict, Verdict::kHealthy);
  EXPECT_TRUE(d.fixes.empty());
  EXPECT_NE(d.headline.find("within 2%"), std::string::npos) << d.headline;
  EXPECT_NE(d.report().find("fixes: none needed"), std::string::npos);
}

TEST(DiagnosisTest, UnsupportedComesFirst) {
  Evidence e = healthy_pair();
  e.unsupported = "Unsupported GPU for bfloat16 mixed precision training";
  const Diagnosis d = decide(e);
  EXPECT_EQ(d.verdict, Verdict::kUnsupported);
  EXPECT_NE(d.fixes.at(0).str().find("to_fp16()"), std::string::npos);
}

TEST(DiagnosisTest, BrokenInFp32BeatsEveryFp16Finding) {
  Evidence e = healthy_pair();
  e.fp32->scale.nonfinite_losses = 3;
  e.fp32->scale.first_nonfinite_step = 7;
  e.mixed->scale.nonfinite_losses = 3;  // NaN in the data: the mixed run does no better
  e.mixed->scale.first_nonfinite_step = 7;
  e.trace_start = OverflowTrace{};
  e.trace_start->first_overflow = OpFinding{0, "aten::linear", "fc1", "", 1e5, 0, true};
  InputReport inputs;
  inputs.nonfinite = 4;
  inputs.findings = {"4 of 40 input values are NaN or Inf: clean or impute the data"};
  e.inputs = inputs;
  const Diagnosis d = decide(e);
  EXPECT_EQ(d.verdict, Verdict::kBrokenInFp32);
  EXPECT_TRUE(contains(d.findings, "input values are NaN or Inf"));
  EXPECT_TRUE(contains(d.findings, "the first at step 7"));
  EXPECT_TRUE(contains(d.fixes, "remove or impute the NaN/Inf"));
  // A baseline that does not learn is broken too, when the mixed run does no better;
  // a mixed run that learns where fp32 does not is not called broken_in_fp32.
  Evidence flat = healthy_pair();
  flat.fp32->final_loss = flat.fp32->first_loss;
  flat.mixed->final_loss = flat.mixed->first_loss;
  EXPECT_EQ(decide(flat).verdict, Verdict::kBrokenInFp32);
  flat.mixed = healthy_pair().mixed;
  EXPECT_NE(decide(flat).verdict, Verdict::kBrokenInFp32);
}

TEST(DiagnosisTest, ForwardOverflowNamesTheOpAndOrdersTheFixes) {
  Evidence e = healthy_pair();
  e.trace_start = OverflowTrace{};
  e.trace_start->first_overflow = OpFinding{3, "aten::linear", "body.2.fc1", "", 123456, 0, true};
  // Its NaNs also collapse the scale: the forward overflow is still the cause.
  e.mixed->scale.collapsed = true;
  e.mixed->scale.skip_rate = 1.0;
  const Diagnosis d = decide(e);
  EXPECT_EQ(d.verdict, Verdict::kForwardOverflow);
  EXPECT_NE(d.headline.find("body.2.fc1 (aten::linear)"), std::string::npos) << d.headline;
  EXPECT_TRUE(contains(d.findings, "outputs reach 1.235e+05"));
  // The fixes follow the measurements: no input check found the inputs unnormalized, so no
  // "normalize the inputs"; the loss scale cannot help a forward overflow, so no init_scale.
  ASSERT_EQ(d.fixes.size(), 3u) << d.report();
  EXPECT_EQ(d.fixes[0].str(), "keep body.2.fc1 in fp32 (PrecisionOptions().keep_fp32({\"body.2.fc1\"})): its ops run in fp32 "
                              "and the rest stays fp16");
  EXPECT_NE(d.fixes[1].str().find("fix the overflowing op, body.2.fc1"), std::string::npos);
  EXPECT_NE(d.fixes[2].str().find("bf16"), std::string::npos);
  for (const auto& f : d.fixes) {
    EXPECT_EQ(f.str().find("init_scale"), std::string::npos) << f.str();
    EXPECT_EQ(f.str().find("normalize"), std::string::npos) << f.str();
  }
  EXPECT_EQ(d.fixes[0].str(mixtrain::run::flag_words()).rfind("keep body.2.fc1 in fp32 (--keep-fp32 body.2.fc1)", 0), 0u);
  // With unnormalized inputs measured, normalizing comes first.
  Evidence raw = e;
  raw.inputs = InputReport{};
  raw.inputs->unnormalized = true;
  raw.inputs->findings = {"inputs have mean 120 and std 80: raw 0-255 pixels"};
  EXPECT_NE(decide(raw).fixes.at(0).str().find("normalize or scale the inputs"), std::string::npos);
  // NaN losses in the first epoch without a traced op are forward overflow too (seed's A).
  Evidence nan_early = healthy_pair();
  nan_early.mixed->scale.nonfinite_losses = 2;
  nan_early.mixed->scale.first_nonfinite_epoch = 0;
  EXPECT_EQ(decide(nan_early).verdict, Verdict::kForwardOverflow);
}

TEST(DiagnosisTest, GradientOverflowOnCollapseOrMostStepsSkipped) {
  Evidence e = healthy_pair();
  e.mixed->scale.collapsed = true;
  e.mixed->scale.skipped = 30;
  e.mixed->scale.skip_rate = 0.3;
  e.mixed->scale.skip_rate_per_epoch = {0.5, 0.1};
  e.mixed->scale.min_scale = 0.25;
  Diagnosis d = decide(e);
  EXPECT_EQ(d.verdict, Verdict::kGradientOverflow);
  EXPECT_TRUE(contains(d.findings, "30 of 100 steps skipped (30%; per epoch: 50%, 10%)"));
  EXPECT_TRUE(contains(d.findings, "collapsed"));
  EXPECT_NE(d.fixes[0].str().find("lower the learning rate"), std::string::npos);
  EXPECT_NE(d.fixes[1].str().find("clipping"), std::string::npos);
  EXPECT_NE(d.fixes[2].str().find("bf16"), std::string::npos);
  Evidence most = healthy_pair();
  most.mixed->scale.skip_rate = most.mixed->scale.skip_rate_after_settling = 0.6;
  EXPECT_EQ(decide(most).verdict, Verdict::kGradientOverflow);
}

TEST(DiagnosisTest, UnderflowOnAGapSkipsPinnedScaleOrFlushedGradients) {
  Evidence gap = healthy_pair();
  gap.mixed->final_loss = gap.mixed->valid_loss = 0.60;  // 20% above fp32
  Diagnosis d = decide(gap);
  EXPECT_EQ(d.verdict, Verdict::kUnderflow);
  EXPECT_TRUE(contains(d.findings, "20% worse"));
  EXPECT_NE(d.fixes[0].str().find("prefer bf16"), std::string::npos);
  // 10% is the boundary: a 9% gap is within fp16 noise.
  Evidence small = healthy_pair();
  small.mixed->final_loss = small.mixed->valid_loss = 0.545;
  EXPECT_EQ(decide(small).verdict, Verdict::kHealthy);

  Evidence skips = healthy_pair();
  skips.mixed->scale.skip_rate = 0.08;
  EXPECT_EQ(decide(skips).verdict, Verdict::kUnderflow);
  EXPECT_TRUE(contains(decide(skips).findings, "too many skipped steps"));

  Evidence flushed = healthy_pair();
  flushed.gradients = GradientHealth{};
  flushed.gradients->scale = 1e-6;
  flushed.gradients->underflow = 0.9;
  EXPECT_EQ(decide(flushed).verdict, Verdict::kUnderflow);
}

TEST(DiagnosisTest, JsonHasVerdictEvidenceAndFixes) {
  Evidence e = healthy_pair();
  e.mixed->final_loss = e.mixed->valid_loss = 0.75;
  e.mixed->valid_loss = NAN;  // not representable in JSON: null, and train loss is compared
  e.fp32->valid_loss = NAN;
  const nlohmann::json j = nlohmann::json::parse(decide(e).to_json());
  EXPECT_EQ(j.at("verdict"), "underflow");
  EXPECT_TRUE(j.at("fixes").is_array());
  EXPECT_FALSE(j.at("fixes").empty());
  EXPECT_TRUE(j.at("evidence").at("mixed").at("valid_loss").is_null());
  EXPECT_NEAR(j.at("evidence").at("gap_percent").get<double>(), 50.0, 1e-9);
  EXPECT_EQ(j.at("evidence").at("mixed").at("scale_history").at("initial_scale"), 65536);
}

} // namespace

namespace {

// `doctor --lr 10`: fp32 itself diverges (validation loss in the thousands) while its
// smoothed train loss still ends below the start. That is broken_in_fp32, not underflow.
TEST(DiagnosisBaselineTest, AnFp32BaselineThatDivergesIsBrokenAndOneThatLearnsSlowlyIsANote) {
  Evidence e = healthy_pair();
  e.fp32->final_loss = 2.0;   // the smoothed train loss fell a little...
  e.fp32->valid_loss = 4870;  // ...but validation exploded
  e.mixed->final_loss = e.mixed->valid_loss = 9000;
  Diagnosis d = decide(e);
  EXPECT_EQ(d.verdict, Verdict::kBrokenInFp32);
  EXPECT_TRUE(contains(d.findings, "validation loss 4870, more than 3x its starting train loss 2.3")) << d.report();

  Evidence chance = healthy_pair();
  chance.fp32->metric_names = {"accuracy"};
  chance.fp32->metrics = {0.11};
  chance.fp32->chance_accuracy = 0.1;
  d = decide(chance);  // at chance but learning (its train loss falls), and fp16 does as well: not broken
  EXPECT_EQ(d.verdict, Verdict::kHealthy) << d.report();
  chance.mixed->scale.nonfinite_losses = 40;  // fp16 NaN where the weak fp32 baseline stays finite
  chance.mixed->scale.first_nonfinite_step = 0;
  chance.mixed->scale.first_nonfinite_epoch = 0;
  d = decide(chance);
  EXPECT_EQ(d.verdict, Verdict::kForwardOverflow) << d.report();
  EXPECT_TRUE(contains(d.findings, "note: the fp32 baseline is weak (validation accuracy 0.11, near chance 0.1)")) << d.report();
  Evidence stuck = healthy_pair();  // a baseline whose train loss does not fall, and fp16 no better
  stuck.fp32->final_loss = stuck.fp32->first_loss;
  stuck.mixed->final_loss = stuck.mixed->first_loss;
  EXPECT_EQ(decide(stuck).verdict, Verdict::kBrokenInFp32);

  Evidence fine = healthy_pair();
  fine.fp32->metric_names = fine.mixed->metric_names = {"accuracy"};
  fine.fp32->metrics = fine.mixed->metrics = {0.8};
  fine.fp32->chance_accuracy = 0.1;
  EXPECT_EQ(decide(fine).verdict, Verdict::kHealthy);
}

// `doctor --lr 10`: fp32 diverges by orders of magnitude and ends below chance, while
// fp16's validation loss is NaN and its train loss still falls. fp32 is broken,
// whatever the mixed run does; not "underflow: fp16 learns less than fp32".
// And a healthy verdict on a baseline that learned nothing says so.
TEST(DiagnosisBaselineTest, ABaselineFarBelowChanceOrDivergedIsBrokenAndHealthyOnAWeakOneSaysLittle) {
  Evidence e = healthy_pair();
  e.fp32->metric_names = e.mixed->metric_names = {"accuracy"};
  e.fp32->chance_accuracy = e.mixed->chance_accuracy = 0.1;
  e.fp32->final_loss = 2.0;
  e.fp32->valid_loss = 14611;
  e.fp32->metrics = {0.011};
  e.mixed->final_loss = 2.1;  // learns on the train loss...
  e.mixed->valid_loss = NAN;  // ...and its validation is NaN
  e.mixed->metrics = {0.1};
  Diagnosis d = decide(e);
  EXPECT_EQ(d.verdict, Verdict::kBrokenInFp32) << d.report();
  EXPECT_TRUE(contains(d.findings, "the fp32 baseline is below chance: validation accuracy 0.011 against 0.1")) << d.report();
  e.fp32->valid_loss = 2.2;  // below chance alone is enough
  EXPECT_EQ(decide(e).verdict, Verdict::kBrokenInFp32) << decide(e).report();
  e.fp32->metrics = {0.5};
  e.fp32->valid_loss = 14611;  // and so is diverging by orders of magnitude
  EXPECT_EQ(decide(e).verdict, Verdict::kBrokenInFp32) << decide(e).report();

  // mobilenet_v3_small at 32x32: fp32 reaches 0.086 (chance 0.1), fp16 as much.
  Evidence weak = healthy_pair();
  weak.fp32->metric_names = weak.mixed->metric_names = {"accuracy"};
  weak.fp32->chance_accuracy = weak.mixed->chance_accuracy = 0.1;
  weak.fp32->metrics = {0.086};
  weak.mixed->metrics = {0.09};
  d = decide(weak);
  EXPECT_EQ(d.verdict, Verdict::kHealthy) << d.report();
  EXPECT_TRUE(contains(d.findings, "note: the fp32 baseline is weak (validation accuracy 0.086, near chance 0.1): that fp16 "
                                   "trains like it says little"))
      << d.report();
  // A strong baseline gets no such note.
  weak.fp32->metrics = weak.mixed->metrics = {0.8};
  EXPECT_FALSE(contains(decide(weak).findings, "says little"));
}

// `doctor --init-scale 1e30`: 16 of 16 steps skipped while the scale backs off; no
// flushes. Not underflow: the start was far too high, and the numbers say so.
TEST(DiagnosisBaselineTest, AScaleStillBackingOffFromAFarTooHighStartIsSaidPlainly) {
  Evidence e = healthy_pair();
  ScaleAnalysis& s = e.mixed->scale;
  s.steps = s.skipped = s.settling_steps = s.longest_skip_run = s.backoffs = 16;
  s.skip_rate = 1.0;
  s.initial_scale = 1e30;
  s.final_scale = s.min_scale = 3.05e25;
  s.settled_scale = 0;  // no step succeeded
  const Diagnosis d = decide(e);
  EXPECT_EQ(d.verdict, Verdict::kGradientOverflow) << d.report();
  EXPECT_NE(d.headline.find("initial loss scale 1e+30 is far too high"), std::string::npos) << d.headline;
  EXPECT_TRUE(contains(d.findings, "it started at 1e+30 and was 3.05e+25 at the last step")) << d.report();
  EXPECT_TRUE(contains(d.findings, "about 69 more steps")) << d.report();  // log2(3.05e25 / 65536) = 68.4
  EXPECT_NE(d.fixes.at(0).str().find("start the scaler lower"), std::string::npos);
  EXPECT_EQ(d.report().find(" to 0"), std::string::npos) << d.report();
}

} // namespace
