#include "mixtrain/diagnose/diagnosis.h"

#include "../json_number.h"
#include "../short_number.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace mixtrain::diagnose {

const char* to_string(Verdict verdict) {
  switch (verdict) {
    case Verdict::kHealthy: return "healthy";
    case Verdict::kForwardOverflow: return "forward_overflow";
    case Verdict::kGradientOverflow: return "gradient_overflow";
    case Verdict::kUnderflow: return "underflow";
    case Verdict::kUnsupported: return "unsupported";
    case Verdict::kBrokenInFp32: return "broken_in_fp32";
  }
  return "unknown";
}

namespace {

using detail::short_number;

std::string pct(double fraction) { return short_number(100 * fraction, 3) + "%"; }

/// A proven fix in the library's words: the calls, joined.
std::string api_of(const Trial& t) {
  std::string out;
  for (const auto& st : t.settings) out += (out.empty() ? "" : "; ") + api_words().setting(st.key, st.value);
  return out;
}

/// The loss both runs are compared on: validation when both have one, else train.
std::pair<double, double> compared_losses(const RunEvidence& a, const RunEvidence& b) {
  if (std::isfinite(a.valid_loss) && std::isfinite(b.valid_loss)) return {a.valid_loss, b.valid_loss};
  return {a.final_loss, b.final_loss};
}

const OpFinding* first_overflow(const Evidence& e) {
  if (e.trace_start && e.trace_start->first_overflow) return &*e.trace_start->first_overflow;
  if (e.trace_end && e.trace_end->first_overflow) return &*e.trace_end->first_overflow;
  return nullptr;
}

std::string overflow_sentence(const OpFinding& f) {
  return "the fp16 forward pass overflows first at " + f.where() + ": outputs reach " +
         (f.max_abs > kFp16Max ? short_number(f.max_abs) : std::string("inf")) + " (fp16 max 65504)" +
         (f.nonfinite ? ", " + std::to_string(f.nonfinite) + " values inf/NaN" : "");
}

std::string scale_sentence(const ScaleAnalysis& s) {
  std::string epochs;
  for (size_t i = 0; i < s.skip_rate_per_epoch.size(); ++i) epochs += (i ? ", " : "") + pct(s.skip_rate_per_epoch[i]);
  return std::to_string(s.skipped) + " of " + std::to_string(s.steps) + " steps skipped (" + pct(s.skip_rate) +
         (s.settling_steps > 0 ? ", the first " + std::to_string(s.settling_steps) + " in a row" : std::string()) +
         "; per epoch: " + epochs + "); loss scale " + short_number(s.initial_scale) + " -> " + short_number(s.final_scale) +
         " (lowest " + short_number(s.min_scale) + ", " + std::to_string(s.backoffs) + " back-offs, longest skip run " +
         std::to_string(s.longest_skip_run) + ")";
}

void add_input_findings(const Evidence& e, std::vector<Phrase>& findings) {
  if (!e.inputs) return;
  for (const auto& f : e.inputs->findings) findings.push_back("input check: " + f);
}

} // namespace

std::optional<double> Evidence::gap_percent() const {
  if (!fp32 || !mixed) return std::nullopt;
  const auto [base, run] = compared_losses(*fp32, *mixed);
  if (!std::isfinite(base) || !std::isfinite(run) || base == 0) return std::nullopt;
  return (run - base) / std::abs(base) * 100;
}

Diagnosis decide(Evidence e) {
  Diagnosis d;
  const RunEvidence* base = e.fp32 ? &*e.fp32 : nullptr;
  const RunEvidence* mixed = e.mixed ? &*e.mixed : nullptr;
  const std::string mixed_name = mixed ? mixed->precision : "mixed precision";
  const std::optional<double> gap = e.gap_percent();
  bool gap_said = false;  // the deciding evidence already states the gap
  std::string weak_baseline;  // a note when the baseline is weak but not the cause

  auto finish = [&](Verdict v, std::string headline, std::vector<Phrase> fixes) {
    d.verdict = v;
    d.headline = std::move(headline);
    d.fixes = std::move(fixes);
    if (!weak_baseline.empty() && v != Verdict::kHealthy) d.findings.push_back(weak_baseline);
    // Context that is not the deciding evidence but helps a reader.
    if (base && mixed && gap && !gap_said) {
      const auto [b, m] = compared_losses(*base, *mixed);
      d.findings.push_back("final loss: fp32 " + short_number(b) + ", " + mixed_name + " " + short_number(m) + " (gap " + short_number(*gap, 3) +
                           "%)");
    }
    if (mixed && mixed->scale.has_scale && v != Verdict::kGradientOverflow) d.findings.push_back(scale_sentence(mixed->scale));
    if (e.gradients && v != Verdict::kUnderflow)
      d.findings.push_back("gradients at scale " + short_number(e.gradients->scale) + ": " + pct(e.gradients->underflow) +
                           " would flush to zero in fp16, " + pct(e.gradients->overflow) + " would overflow");
    const OverflowTrace* t = e.trace_start ? &*e.trace_start : nullptr;
    if (t && !t->at_risk.empty() && v != Verdict::kForwardOverflow)
      d.findings.push_back("at risk (fp16 outputs above 2^14): " + t->at_risk.front().where() + " reaches " +
                           short_number(t->at_risk.front().max_abs));
    if (e.inputs)
      for (const auto& f : e.inputs->findings) {
        const std::string line = "input check: " + f;
        if (std::none_of(d.findings.begin(), d.findings.end(), [&](const Phrase& p) { return p.str() == line; }))
          d.findings.push_back(line);
      }
    d.evidence = std::move(e);
    return d;
  };

  // D: it cannot run at all.
  if (!e.unsupported.empty()) {
    d.findings.push_back(e.unsupported);
    const bool bf16 = e.unsupported.str().find("bfloat16") != std::string::npos;
    return finish(Verdict::kUnsupported, "unsupported: " + std::string(bf16 ? "bf16" : "fp16") +
                                             " mixed precision cannot run on this device",
                  bf16 ? std::vector<Phrase>{"use " + Phrase::setting("precision", "fp16") +
                                             " or fp32 on this GPU; bf16 needs an Ampere or newer GPU"}
                       : std::vector<Phrase>{
                             "train in bf16 (real CPU autocast, " + Phrase::setting("precision", "bf16") +
                                 ") or fp32 on this machine",
                             "allow fp16 emulation (" + Phrase::setting("no_emulation", "false") +
                                 ") to check fp16 safety on CPU",
                             "run fp16 on a CUDA GPU for its speed-up"});
  }

  // The fp32 baseline first: if it fails and the mixed run does no better, fp16 is
  // not the cause. A baseline that learns slowly is a note, not a verdict; and a
  // mixed run that goes non-finite or skips steps where fp32 stays finite always
  // gets the mixed-precision verdict, however weak the baseline.
  if (base) {
    const bool nonfinite = base->scale.nonfinite_losses > 0 || !std::isfinite(base->final_loss);
    const bool loss_fell = std::isfinite(base->first_loss) && std::isfinite(base->final_loss) &&
                           base->final_loss < base->first_loss;
    // A NaN validation loss means no validation ran (unknown), an inf one diverged.
    const bool valid_far_above = std::isfinite(base->first_loss) && base->valid_loss > kValidLossFarAbove * base->first_loss;
    double accuracy = std::numeric_limits<double>::quiet_NaN();
    for (size_t i = 0; i < base->metric_names.size() && i < base->metrics.size(); ++i)
      if (base->metric_names[i] == "accuracy") accuracy = base->metrics[i];
    const bool at_chance = std::isfinite(accuracy) && std::isfinite(base->chance_accuracy) &&
                           accuracy <= kChanceAccuracyFactor * base->chance_accuracy;
    const bool fails = nonfinite || !loss_fell || valid_far_above;
    const ScaleAnalysis* ms = mixed ? &mixed->scale : nullptr;
    const bool mixed_breaks_alone =
        !nonfinite && ms && (ms->nonfinite_losses > 0 || skips_are_a_problem(*ms) || ms->collapsed);
    const bool mixed_learns = mixed && ms->nonfinite_losses == 0 && std::isfinite(mixed->first_loss) &&
                              std::isfinite(mixed->final_loss) && mixed->final_loss < mixed->first_loss &&
                              !(mixed->valid_loss > kValidLossFarAbove * mixed->first_loss);
    if (fails && !mixed_breaks_alone && !mixed_learns) {
      add_input_findings(e, d.findings);
      if (nonfinite)
        d.findings.push_back("the fp32 baseline fails too: " + std::to_string(base->scale.nonfinite_losses) +
                             " NaN/Inf losses, the first at step " + std::to_string(base->scale.first_nonfinite_step));
      else if (!loss_fell)
        d.findings.push_back("the fp32 baseline does not learn: loss " + short_number(base->first_loss) + " -> " +
                             short_number(base->final_loss));
      if (!nonfinite && valid_far_above)
        d.findings.push_back("the fp32 baseline diverges: validation loss " + short_number(base->valid_loss) + ", more than " +
                             short_number(kValidLossFarAbove) + "x its starting train loss " + short_number(base->first_loss));
      if (!nonfinite && at_chance)
        d.findings.push_back("the fp32 baseline is at chance: validation accuracy " + short_number(accuracy) + " against " +
                             short_number(base->chance_accuracy) + " for a guess");
      std::vector<Phrase> fixes{"fix the model or the data first: fp16 is not the cause (fp32 fails the same way)"};
      if (e.inputs && e.inputs->nonfinite) fixes.push_back("remove or impute the NaN/Inf values in the inputs");
      if (e.inputs && e.inputs->unnormalized) fixes.push_back("normalize the inputs (mean 0, std 1)");
      fixes.push_back("lower the learning rate if the loss diverges");
      return finish(Verdict::kBrokenInFp32, "broken_in_fp32: the fp32 baseline fails too", fixes);
    }
    if (fails || at_chance)
      weak_baseline = "note: the fp32 baseline is weak (" +
                      std::string(nonfinite        ? "its losses go NaN/Inf too"
                                  : !loss_fell      ? "its train loss does not fall"
                                  : valid_far_above ? "its validation loss diverges"
                                                    : "validation accuracy " + short_number(accuracy) + ", near chance " +
                                                          short_number(base->chance_accuracy)) +
                      "), but " + mixed_name + " fails where fp32 does not: mixed precision is a cause here";
  }

  const ScaleAnalysis* s = mixed ? &mixed->scale : nullptr;
  const OpFinding* overflow = first_overflow(e);
  const bool nan_in_first_epoch = s && s->nonfinite_losses > 0 && s->first_nonfinite_epoch == 0;

  // A: the forward pass overflows.
  if (overflow || (nan_in_first_epoch && !s->collapsed)) {
    if (overflow) d.findings.push_back(overflow_sentence(*overflow));
    if (s && s->nonfinite_losses > 0)
      d.findings.push_back(std::to_string(s->nonfinite_losses) + " " + mixed_name + " losses were NaN/Inf, the first at step " +
                           std::to_string(s->first_nonfinite_step) + " (epoch " + std::to_string(s->first_nonfinite_epoch) + ")");
    add_input_findings(e, d.findings);
    // Fixes that follow the measurements: the inputs only when the input check
    // found them unnormalized; the scaler never (the loss scale does not touch the
    // forward pass).
    std::vector<Phrase> fixes;
    if (e.inputs && e.inputs->unnormalized) fixes.push_back("normalize or scale the inputs: " + e.inputs->findings.back());
    const std::string module = overflow ? overflow->island() : std::string();
    if (!module.empty())
      fixes.push_back("keep " + module + " in fp32 (" + Phrase::setting("keep_fp32", module) +
                      "): its ops run in fp32 and the rest stays " + mixed_name);
    fixes.push_back(overflow ? "fix the overflowing op, " + overflow->where() +
                                   ": scale its inputs or weights down (large logits from an unscaled layer, exp/pow in "
                                   "custom code, a custom loss casting to half)"
                             : "fix the overflowing op (large logits from an unscaled layer, exp/pow in custom code, a "
                               "custom loss casting to half)");
    fixes.push_back("or train in bf16 (" + Phrase::setting("precision", "bf16") + ": fp32's exponent range, no overflow at 65504)");
    return finish(Verdict::kForwardOverflow, "forward_overflow: an fp16 activation overflows in the forward pass" +
                                                 (overflow ? " at " + overflow->where() : std::string()),
                  fixes);
  }

  // B': (almost) every step skipped while the scale was still backing off from a start
  // far too high: not underflow, and not a model whose gradients overflow at any scale.
  if (s && s->has_scale && !s->collapsed && s->skip_rate >= kSkipRateAlmostAll &&
      s->settling_steps >= static_cast<int64_t>(kSkipRateAlmostAll * static_cast<double>(s->steps))) {
    // A workable scale: what the measured gradients leave room for, else torch's default.
    // Unscaled gradients that are themselves inf/NaN leave no room to compute: keep the default.
    const double workable = e.gradients ? roomy_scale(*e.gradients, 65536) : 65536;
    const double last = s->final_scale;
    const int64_t more = last > workable ? static_cast<int64_t>(std::ceil(std::log2(last / workable))) : 0;
    d.findings.push_back(std::to_string(s->skipped) + " of " + std::to_string(s->steps) +
                         " steps skipped while the loss scale was still backing off: it started at " +
                         short_number(s->initial_scale) + " and was " + short_number(last) + " at the last step");
    if (more > 0)
      d.findings.push_back("halving once per skipped step, it would need about " + std::to_string(more) +
                           " more steps to reach a workable scale (" + short_number(workable) + ")");
    return finish(Verdict::kGradientOverflow,
                  "gradient_overflow: the initial loss scale " + short_number(s->initial_scale) +
                      " is far too high; the back-off never reached a workable scale in this run",
                  {"start the scaler lower: " + Phrase::setting("init_scale", short_number(workable)),
                   "or train longer: the back-off settles by itself after about " + std::to_string(more) + " more steps"});
  }

  // B: gradients keep overflowing; the back-off cannot outrun them.
  if (s && s->has_scale && (s->collapsed || s->skip_rate_after_settling >= kSkipRateMost ||
                            (s->nonfinite_losses > 0 && s->skip_rate > kSkipRateProblem))) {
    d.findings.push_back(scale_sentence(*s));
    if (s->collapsed)
      d.findings.push_back("the loss scale collapsed (repeated back-off down to " + short_number(s->min_scale) + ")");
    if (s->nonfinite_losses > 0)
      d.findings.push_back(std::to_string(s->nonfinite_losses) + " losses were NaN/Inf mid-training, the first at step " +
                           std::to_string(s->first_nonfinite_step));
    if (e.gradients && e.gradients->overflow > 0)
      d.findings.push_back(pct(e.gradients->overflow) + " of gradient elements overflow fp16 at scale " +
                           short_number(e.gradients->scale) + " (largest in " + e.gradients->params.front().name + ")");
    return finish(Verdict::kGradientOverflow,
                  "gradient_overflow: gradients overflow fp16 on " + pct(s->skip_rate) + " of steps" +
                      (s->collapsed ? " and the loss scale collapsed" : ""),
                  {"lower the learning rate", "add gradient clipping (" + Phrase::setting("clip", "1") + ")",
                   "or accept that this model is not fp16-safe: switch to bf16 (" + Phrase::setting("precision", "bf16") +
                       ": no scaler, no overflow cliff) or back to fp32"});
  }

  // C: it runs, but learns less than fp32.
  const bool gap_problem = gap && *gap > kGapPercentProblem;
  const bool skip_problem = s && skips_are_a_problem(*s);
  const bool pinned = s && s->pinned_at_min_with_flat_loss;
  const bool flushes = e.gradients && e.gradients->underflow > kUnderflowProblem;
  if (gap_problem || skip_problem || pinned || flushes) {
    if (gap_problem) {
      const auto [b, m] = compared_losses(*base, *mixed);
      d.findings.push_back(mixed_name + " plateaus above fp32: final loss " + short_number(m) + " vs " + short_number(b) + " (" +
                           short_number(*gap, 3) + "% worse)");
    }
    if (e.gradients)
      d.findings.push_back(pct(e.gradients->underflow) + " of nonzero gradient elements flush to zero in fp16 at scale " +
                           short_number(e.gradients->scale) +
                           (e.gradients->params.empty() ? std::string()
                                                        : " (worst: " + e.gradients->params.front().name + ", " +
                                                              pct(e.gradients->params.front().underflow) + ")"));
    if (pinned) d.findings.push_back("the loss scale sits at its minimum while the loss is flat");
    if (skip_problem) d.findings.push_back("too many skipped steps: " + pct(s->skip_rate) + " of the optimizer steps did nothing");
    gap_said = gap_problem;
    std::vector<Phrase> fixes;
    // Targeted fixes first, when the measurements point at the scaler itself;
    // then the guide's fix for underflow (bf16). The targeted ones go beyond the guide.
    // When gradients flush and none overflows, the measured gradients say how far
    // the scale can safely go up.
    if (e.gradients && e.gradients->underflow > 0.01 && e.gradients->overflow == 0 && s && s->skipped == 0) {
      const double largest = largest_gradient(*e.gradients);
      if (largest > 0) {
        const double safe = roomy_scale(*e.gradients, 0);
        if (safe >= 4 * e.gradients->scale)
          fixes.push_back("raise the loss scale: at " + short_number(e.gradients->scale) + " " + pct(e.gradients->underflow) +
                          " of gradients flush to zero, and the largest gradient (" + short_number(largest) + ") leaves room up to " +
                          short_number(safe) + " (" + Phrase::setting("init_scale", short_number(safe)) + ")");
      }
    }
    if (skip_problem && s->settling_steps * 2 >= s->skipped)
      fixes.push_back("start the scaler lower: the first " + std::to_string(s->settling_steps) +
                      " steps were skipped backing off from " + short_number(s->initial_scale) + " to " +
                      short_number(s->settled_scale) + " (" + Phrase::setting("init_scale", short_number(s->settled_scale)) + ")");
    else if (skip_problem)
      fixes.push_back("if steps are skipped: lower the learning rate or clip gradients (" + Phrase::setting("clip", "1") + ")");
    fixes.push_back(
        "this model needs fp32's range: prefer bf16 (" + Phrase::setting("precision", "bf16") +
        ": fp32's exponent range, half the memory) over fighting the scaler");
    fixes.push_back("or stay in fp32");
    return finish(Verdict::kUnderflow,
                  "underflow: " + mixed_name + " learns less than fp32" +
                      (gap_problem ? " (final loss " + short_number(*gap, 3) + "% higher)" : std::string()),
                  fixes);
  }

  return finish(Verdict::kHealthy,
                "healthy: " + mixed_name + " trains like fp32" +
                    (gap ? " (final loss within " + short_number(std::abs(*gap), 2) + "%)" : std::string()),
                {});
}

namespace {

nlohmann::json finding_json(const OpFinding& f) {
  return {{"op", f.op}, {"module", f.module}, {"after_module", f.after_module}, {"scope", f.scope}, {"where", f.where()},
          {"max_abs", f.max_abs}, {"nonfinite", f.nonfinite}, {"fp16", f.fp16}, {"index", f.index}};
}

using mixtrain::detail::json_number;

nlohmann::json trace_json(const OverflowTrace& t) {
  nlohmann::json j{{"ops_traced", t.ops_traced}, {"input_nonfinite", t.input_nonfinite}, {"loss", json_number(t.loss)}};
  j["first_overflow"] = t.first_overflow ? finding_json(*t.first_overflow) : nlohmann::json(nullptr);
  j["first_fp32_nonfinite"] = t.first_fp32_nonfinite ? finding_json(*t.first_fp32_nonfinite) : nlohmann::json(nullptr);
  j["at_risk"] = nlohmann::json::array();
  for (size_t i = 0; i < std::min<size_t>(t.at_risk.size(), 5); ++i) j["at_risk"].push_back(finding_json(t.at_risk[i]));
  return j;
}

nlohmann::json run_json(const RunEvidence& r) {
  const ScaleAnalysis& s = r.scale;
  nlohmann::json j{{"precision", r.precision},
                   {"emulated", r.emulated},
                   {"steps", s.steps},
                   {"first_loss", json_number(r.first_loss)},
                   {"final_loss", json_number(r.final_loss)},
                   {"valid_loss", json_number(r.valid_loss)},
                   {"nonfinite_losses", s.nonfinite_losses},
                   {"first_nonfinite_step", s.first_nonfinite_step}};
  for (size_t i = 0; i < r.metric_names.size() && i < r.metrics.size(); ++i) j[r.metric_names[i]] = json_number(r.metrics[i]);
  if (s.has_scale)
    j["scale_history"] = {{"skipped_steps", s.skipped},
                          {"skip_rate", s.skip_rate},
                          {"skip_rate_per_epoch", s.skip_rate_per_epoch},
                          {"initial_scale", s.initial_scale},
                          {"final_scale", s.final_scale},
                          {"min_scale", s.min_scale},
                          {"max_scale", s.max_scale},
                          {"backoffs", s.backoffs},
                          {"longest_skip_run", s.longest_skip_run},
                          {"collapsed", s.collapsed},
                          {"pinned_at_min_with_flat_loss", s.pinned_at_min_with_flat_loss}};
  return j;
}

} // namespace

namespace {
nlohmann::json phrases_json(const std::vector<Phrase>& phrases, const OptionWords& words) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : phrases) j.push_back(p.str(words));
  return j;
}
} // namespace

std::string Diagnosis::to_json(const OptionWords& words) const {
  nlohmann::json ev = nlohmann::json::object();
  const Evidence& e = evidence;
  if (!e.unsupported.empty()) ev["unsupported"] = e.unsupported.str(words);
  if (e.fp32) ev["fp32"] = run_json(*e.fp32);
  if (e.mixed) ev["mixed"] = run_json(*e.mixed);
  if (auto g = e.gap_percent()) ev["gap_percent"] = *g;
  if (e.trace_start) ev["overflow_trace_initial_weights"] = trace_json(*e.trace_start);
  if (e.trace_end) ev["overflow_trace_final_weights"] = trace_json(*e.trace_end);
  if (const OpFinding* f = first_overflow(e)) ev["first_overflow"] = finding_json(*f);
  if (e.gradients) {
    nlohmann::json params = nlohmann::json::array();
    for (size_t i = 0; i < std::min<size_t>(e.gradients->params.size(), 8); ++i) {
      const auto& p = e.gradients->params[i];
      params.push_back({{"name", p.name}, {"numel", p.numel}, {"nonzero", p.nonzero}, {"underflow", p.underflow},
                        {"overflow", p.overflow}, {"max_abs", json_number(p.max_abs)}});
    }
    ev["gradient_health"] = {{"scale", e.gradients->scale}, {"underflow", e.gradients->underflow},
                             {"overflow", e.gradients->overflow}, {"params_worst_first", params}};
  }
  if (e.inputs)
    ev["inputs"] = {{"numel", e.inputs->numel}, {"nonfinite", e.inputs->nonfinite}, {"mean", json_number(e.inputs->mean)},
                    {"std", json_number(e.inputs->std)}, {"min", json_number(e.inputs->min)}, {"max", json_number(e.inputs->max)},
                    {"raw_pixels", e.inputs->raw_pixels}, {"unnormalized", e.inputs->unnormalized},
                    {"findings", e.inputs->findings}};
  nlohmann::json j{{"verdict", to_string(verdict)}, {"headline", headline}, {"findings", phrases_json(findings, words)},
                   {"evidence", ev}, {"fixes", phrases_json(fixes, words)}};
  j["trials"] = nlohmann::json::array();
  auto trial_json = [&](const Trial& t) {
    return nlohmann::json{{"fix", t.fix.str(words)},
                          {"flags", t.settings_in(words)},
                          {"api", api_of(t)},
                          {"finite", t.finite},
                          {"skipped", t.skipped},
                          {"gap_percent", t.gap_percent ? nlohmann::json(*t.gap_percent) : nlohmann::json(nullptr)},
                          {"seconds", t.seconds},
                          {"verdict", to_string(t.verdict)},
                          {"error", t.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(t.error)},
                          {"proven", t.proven()}};
  };
  for (const auto& t : trials) j["trials"].push_back(trial_json(t));
  j["proven_fix"] = proven_fix ? trial_json(trials[*proven_fix]) : nlohmann::json(nullptr);
  return j.dump(2) + "\n";
}

std::string Trial::settings_in(const OptionWords& words) const {
  std::string out;
  for (const auto& st : settings) out += (out.empty() ? "" : " ") + words.setting(st.key, st.value);
  return out;
}

std::string Diagnosis::report(const OptionWords& words) const {
  std::ostringstream out;
  out << "verdict: " << to_string(verdict) << "\n  " << headline << "\n";
  if (!findings.empty()) {
    out << "evidence:\n";
    for (const auto& f : findings) out << "  - " << f.str(words) << "\n";
  }
  if (fixes.empty()) {
    out << "fixes: none needed\n";
  } else {
    out << "fixes, in order:\n";
    for (size_t i = 0; i < fixes.size(); ++i) out << "  " << i + 1 << ". " << fixes[i].str(words) << "\n";
  }
  if (!trials.empty()) {
    out << "trials (each the mixed run again with one fix, same weights, seed and data order):\n";
    char line[512];
    std::snprintf(line, sizeof(line), "  %-44s %-8s %-8s %-9s %s\n", "fix", "finite", "skipped", "gap", "seconds");
    out << line;
    for (const auto& t : trials) {
      const std::string gap = t.gap_percent ? short_number(*t.gap_percent, 3) + "%" : "-";
      std::snprintf(line, sizeof(line), "  %-44s %-8s %-8lld %-9s %.1f  %s\n", t.settings_in(words).c_str(),
                    t.finite ? "yes" : "no", static_cast<long long>(t.skipped), gap.c_str(), t.seconds,
                    t.proven() ? "proven" : !t.error.empty() ? ("failed: " + t.error).c_str() : to_string(t.verdict));
      out << line;
    }
    if (proven_fix) {
      const Trial& t = trials[*proven_fix];
      out << "proven fix: " << t.fix.str(words) << "\n  flags: " << t.settings_in(words) << "\n  library: " << api_of(t)
          << "\n";
    } else {
      out << "proven fix: none: no trial trained like fp32 by the verdict's rules\n";
    }
  }
  return out.str();
}

} // namespace mixtrain::diagnose
