// The verdict catalogue: each verdict's rules and trials, one small function each,
// in the order decide() tries them. The rules read measurements alone, never
// which model it is.
#include "diagnose/catalogue.h"

#include "mixtrain/amp/loss_scale_rule.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/diagnose/fit_warning.h"
#include "util/short_number.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace mixtrain::diagnose::detail {

using mixtrain::detail::short_number;

std::string pct(double fraction) { return short_number(100 * fraction, 3) + "%"; }

std::pair<double, double> compared_losses(const RunEvidence& a, const RunEvidence& b) {
  if (std::isfinite(a.valid_loss) && std::isfinite(b.valid_loss)) return {a.valid_loss, b.valid_loss};
  return {a.final_loss, b.final_loss};
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

namespace {

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

void add_input_findings(const Evidence& e, std::vector<Phrase>& findings) {
  if (!e.inputs) return;
  for (const auto& f : e.inputs->findings) findings.push_back("input check: " + f);
}

/// A scale as a trial's setting writes it: "256", "1.049e+06".
std::string trial_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

/// fp16's GradScaler is compared: its scale trials, and bf16 as the alternative, apply.
bool uses_grad_scaler(const CompareOptions& o) { return mode_of(o.precision()).grad_scaler; }

const Fix& bf16_trial() {
  static const Fix kFix{"train in bf16", {{"precision", "bf16"}}};
  return kFix;
}

// ---- unsupported: this precision cannot run here -------------------------------

std::optional<Ruling> cannot_run(RuleInput& in) {
  if (in.e.unsupported.empty()) return std::nullopt;
  const bool bf16 = in.e.unsupported.str().find("bfloat16") != std::string::npos;
  Ruling r;
  r.findings.push_back(in.e.unsupported);
  r.headline = "unsupported: " + std::string(bf16 ? "bf16" : "fp16") + " mixed precision cannot run on this device";
  if (bf16)
    r.fixes = {"use " + Phrase::setting("precision", "fp16") + " or fp32 on this GPU; bf16 needs an Ampere or newer GPU"};
  else
    r.fixes = {"train in bf16 (real CPU autocast, " + Phrase::setting("precision", "bf16") + ") or fp32 on this machine",
               "allow fp16 emulation (" + Phrase::setting("no_emulation", "false") + ") to check fp16 safety on CPU",
               "run fp16 on a CUDA GPU for its speed-up"};
  return r;
}

/// "step 12 (epoch 0)" for a run from scratch; "the window's step 0 (its epoch 0)" for a
/// window replayed from a checkpoint (first_step > 0), whose steps count from the branch point.
std::string at_step(const RunEvidence& r, int64_t step, int64_t epoch = -1) {
  const bool window = r.first_step > 0;
  std::string out = (window ? "the window's step " : "step ") + std::to_string(step);
  if (epoch >= 0) out += (window ? " (its epoch " : " (epoch ") + std::to_string(epoch) + ")";
  return out;
}

// ---- broken_in_fp32: the baseline fails too ------------------------------------

// If the fp32 baseline fails and the mixed run does no better, fp16 is not the
// cause. A baseline that learns slowly is a note, not a verdict; and a mixed run
// that goes non-finite or skips steps where fp32 stays finite always gets the
// mixed-precision verdict, however weak the baseline.
std::optional<Ruling> baseline_fails(RuleInput& in) {
  const RunEvidence* base = in.base;
  const RunEvidence* mixed = in.mixed;
  if (!base) return std::nullopt;
  const bool nonfinite = base->scale.nonfinite_losses > 0 || !std::isfinite(base->final_loss);
  // A window replayed late in a run may not move a converged baseline: no fault there.
  const bool loss_fell = in.e.branched || (std::isfinite(base->first_loss) && std::isfinite(base->final_loss) &&
                                           base->final_loss < base->first_loss);
  // A NaN validation loss means no validation ran (unknown), an inf one diverged.
  const bool valid_far_above = std::isfinite(base->first_loss) && base->valid_loss > kValidLossFarAbove * base->first_loss;
  double accuracy = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = 0; i < base->metric_names.size() && i < base->metrics.size(); ++i)
    if (base->metric_names[i] == "accuracy") accuracy = base->metrics[i];
  const bool at_chance = std::isfinite(accuracy) && std::isfinite(base->chance_accuracy) &&
                         accuracy <= kChanceAccuracyFactor * base->chance_accuracy;
  const bool fails = nonfinite || !loss_fell || valid_far_above;
  const bool diverged = (std::isfinite(base->first_loss) && base->valid_loss > kValidLossDiverged * base->first_loss) ||
                        std::isinf(base->valid_loss);
  const bool below_chance = std::isfinite(accuracy) && std::isfinite(base->chance_accuracy) &&
                            accuracy < kFarBelowChanceFactor * base->chance_accuracy;
  const ScaleAnalysis* ms = mixed ? &mixed->scale : nullptr;
  const bool mixed_breaks_alone =
      !nonfinite && ms && (ms->nonfinite_losses > 0 || skips_are_a_problem(*ms) || ms->collapsed);
  const bool mixed_learns = mixed && ms->nonfinite_losses == 0 && std::isfinite(mixed->first_loss) &&
                            std::isfinite(mixed->final_loss) && mixed->final_loss < mixed->first_loss &&
                            !(mixed->valid_loss > kValidLossFarAbove * mixed->first_loss);
  if ((fails && !mixed_breaks_alone && !mixed_learns) || (!nonfinite && (diverged || below_chance))) {
    Ruling r;
    add_input_findings(in.e, r.findings);
    if (nonfinite)
      r.findings.push_back("the fp32 baseline fails too: " + std::to_string(base->scale.nonfinite_losses) +
                           " NaN/Inf losses, the first at " + at_step(*base, base->scale.first_nonfinite_step));
    else if (!loss_fell)
      r.findings.push_back("the fp32 baseline does not learn: loss " + short_number(base->first_loss) + " -> " +
                           short_number(base->final_loss));
    if (!nonfinite && valid_far_above)
      r.findings.push_back("the fp32 baseline diverges: validation loss " + short_number(base->valid_loss) + ", more than " +
                           short_number(kValidLossFarAbove) + "x its starting train loss " + short_number(base->first_loss));
    if (!nonfinite && at_chance)
      r.findings.push_back(std::string("the fp32 baseline is ") + (accuracy < base->chance_accuracy ? "below" : "at") +
                           " chance: validation accuracy " + short_number(accuracy) + " against " +
                           short_number(base->chance_accuracy) + " for a guess");
    r.fixes = {"fix the model or the data first: mixed precision is not the cause (fp32 fails the same way)"};
    if (in.e.inputs && in.e.inputs->nonfinite) r.fixes.push_back("remove or impute the NaN/Inf values in the inputs");
    if (in.e.inputs && in.e.inputs->unnormalized) r.fixes.push_back("normalize the inputs (mean 0, std 1)");
    r.fixes.push_back("lower the learning rate if the loss diverges");
    r.headline = "broken_in_fp32: the fp32 baseline fails too";
    return r;
  }
  if (fails || at_chance) {
    const std::string weakness = "note: the fp32 baseline is weak (" +
                                 std::string(nonfinite        ? "its losses go NaN/Inf too"
                                             : !loss_fell      ? "its train loss does not fall"
                                             : valid_far_above ? "its validation loss diverges"
                                                               : "validation accuracy " + short_number(accuracy) +
                                                                     ", near chance " + short_number(base->chance_accuracy)) +
                                 ")";
    in.weak_baseline = weakness + ", but " + in.mixed_name + " fails where fp32 does not: mixed precision is a cause here";
    in.weak_baseline_healthy = weakness + ": that " + in.mixed_name +
                               " trains like it says little; make fp32 learn first (more " + Phrase::name("epochs") +
                               ", another " + Phrase::name("lr") + "), then compare again";
  }
  return std::nullopt;
}

// ---- forward_overflow: an fp16 activation overflows ----------------------------

std::optional<Ruling> activation_overflows(RuleInput& in) {
  const ScaleAnalysis* s = in.mixed ? &in.mixed->scale : nullptr;
  const OpFinding* overflow = first_overflow(in.e);
  const bool nan_in_first_epoch = s && s->nonfinite_losses > 0 && s->first_nonfinite_epoch == 0;
  if (!overflow && !(nan_in_first_epoch && !s->collapsed)) return std::nullopt;
  Ruling r;
  if (overflow) r.findings.push_back(overflow_sentence(*overflow));
  if (s && s->nonfinite_losses > 0)
    r.findings.push_back(std::to_string(s->nonfinite_losses) + " " + in.mixed_name + " losses were NaN/Inf, the first at " +
                         at_step(*in.mixed, s->first_nonfinite_step, s->first_nonfinite_epoch));
  add_input_findings(in.e, r.findings);
  // Fixes that follow the measurements: the inputs only when the input check
  // found them unnormalized; the scaler never (the loss scale does not touch the
  // forward pass).
  if (in.e.inputs && in.e.inputs->unnormalized)
    r.fixes.push_back("normalize or scale the inputs: " + in.e.inputs->findings.back());
  const std::string module = overflow ? overflow->island() : std::string();
  if (!module.empty())
    r.fixes.push_back("keep " + module + " in fp32 (" + Phrase::setting("keep_fp32", module) +
                      "): its ops run in fp32 and the rest stays " + in.mixed_name);
  r.fixes.push_back(overflow ? "fix the overflowing op, " + overflow->where() +
                                   ": scale its inputs or weights down (large logits from an unscaled layer, exp/pow in "
                                   "custom code, a custom loss casting to half)"
                             : "fix the overflowing op (large logits from an unscaled layer, exp/pow in custom code, a "
                               "custom loss casting to half)");
  r.fixes.push_back("or train in bf16 (" + Phrase::setting("precision", "bf16") + ": fp32's exponent range, no overflow at 65504)");
  r.headline = "forward_overflow: an fp16 activation overflows in the forward pass" +
               (overflow ? " at " + overflow->where() : std::string());
  return r;
}

// The overflowing module in fp32 (compare() adds the next one while a trial still
// overflows), then bf16.
std::vector<Fix> forward_overflow_trials(const Diagnosis& d, const CompareOptions& o) {
  std::vector<Fix> out;
  const OpFinding* f = first_overflow(d.evidence);
  if (f && !f->island().empty()) out.push_back({"keep " + f->island() + " in fp32", {{"keep_fp32", f->island()}}});
  if (uses_grad_scaler(o)) out.push_back(bf16_trial());
  return out;
}

// ---- gradient_overflow: the scale cannot outrun overflowing gradients -----------

// (Almost) every step skipped while the scale was still backing off from a start
// far too high: not underflow, and not a model whose gradients overflow at any scale.
std::optional<Ruling> backoff_never_settled(RuleInput& in) {
  const ScaleAnalysis* s = in.mixed ? &in.mixed->scale : nullptr;
  if (!(s && s->has_scale && !s->collapsed && s->skip_rate >= kSkipRateAlmostAll &&
        s->settling_steps >= static_cast<int64_t>(kSkipRateAlmostAll * static_cast<double>(s->steps))))
    return std::nullopt;
  // A workable scale: what the measured gradients leave room for, else torch's default.
  // Unscaled gradients that are themselves inf/NaN leave no room to compute: keep the default.
  const double workable = in.e.gradients ? roomy_scale(*in.e.gradients, amp::kDefaultInitScale) : amp::kDefaultInitScale;
  const double last = s->final_scale;
  const int64_t more = last > workable ? static_cast<int64_t>(std::ceil(std::log2(last / workable))) : 0;
  Ruling r;
  r.findings.push_back(std::to_string(s->skipped) + " of " + std::to_string(s->steps) +
                       " steps skipped while the loss scale was still backing off: it started at " +
                       short_number(s->initial_scale) + " and was " + short_number(last) + " at the last step");
  if (more > 0)
    r.findings.push_back("halving once per skipped step, it would need about " + std::to_string(more) +
                         " more steps to reach a workable scale (" + short_number(workable) + ")");
  r.headline = "gradient_overflow: the initial loss scale " + short_number(s->initial_scale) +
               " is far too high; the back-off never reached a workable scale in this run";
  r.fixes = {"start the scaler lower: " + Phrase::setting("init_scale", short_number(workable)),
             "or train longer: the back-off settles by itself after about " + std::to_string(more) + " more steps"};
  return r;
}

std::optional<Ruling> gradients_keep_overflowing(RuleInput& in) {
  const ScaleAnalysis* s = in.mixed ? &in.mixed->scale : nullptr;
  if (!(s && s->has_scale &&
        (s->collapsed || s->skip_rate_after_settling >= kSkipRateMost || (s->nonfinite_losses > 0 && s->skip_rate > kSkipRateProblem))))
    return std::nullopt;
  Ruling r;
  r.findings.push_back(scale_sentence(*s));
  if (s->collapsed) r.findings.push_back("the loss scale collapsed (repeated back-off down to " + short_number(s->min_scale) + ")");
  if (s->nonfinite_losses > 0)
    r.findings.push_back(std::to_string(s->nonfinite_losses) + " losses were NaN/Inf mid-training, the first at " +
                         at_step(*in.mixed, s->first_nonfinite_step));
  const auto& g = in.e.gradients;
  if (g && g->overflow > 0)
    r.findings.push_back(pct(g->overflow) + " of gradient elements overflow fp16 at scale " + short_number(g->scale) +
                         " (largest in " + g->params.front().name + ")");
  r.headline = "gradient_overflow: gradients overflow fp16 on " + pct(s->skip_rate) + " of steps" +
               (s->collapsed ? " and the loss scale collapsed" : "");
  r.fixes = {"lower the learning rate", "add gradient clipping (" + Phrase::setting("clip", "1") + ")",
             "or accept that this model is not fp16-safe: switch to bf16 (" + Phrase::setting("precision", "bf16") +
                 ": no scaler, no overflow cliff) or back to fp32"};
  return r;
}

// A lower initial scale, clipping, bf16, and an island for the layer whose gradients overflow.
std::vector<Fix> gradient_overflow_trials(const Diagnosis& d, const CompareOptions& o) {
  std::vector<Fix> out;
  const Evidence& e = d.evidence;
  const double start = e.mixed ? e.mixed->scale.initial_scale : amp::kDefaultInitScale;
  const double lower = std::max(1.0, std::min(256.0, start / 256));
  out.push_back({"start the scaler lower", {{"init_scale", trial_number(lower)}}});
  out.push_back({"clip gradients", {{"clip", "1"}}});
  if (uses_grad_scaler(o)) out.push_back(bf16_trial());
  if (e.gradients && !e.gradients->params.empty() && e.gradients->overflow > 0) {
    const std::string& p = e.gradients->params.front().name;
    const std::string module = p.substr(0, p.rfind('.') == std::string::npos ? 0 : p.rfind('.'));
    if (!module.empty()) out.push_back({"keep " + module + " in fp32", {{"keep_fp32", module}}});
  }
  return out;
}

// ---- lost_updates: 16-bit weights round their updates away ---------------------

/// What an island for lost updates costs, in words: "1,024 parameters (0.5% of the
/// model), 8 KiB more".
std::string island_cost(const LostUpdateReport& lost) {
  const double share = lost.params > 0 ? 100.0 * static_cast<double>(lost.island_params) / static_cast<double>(lost.params) : 0;
  const double bytes = static_cast<double>(lost.island_extra_bytes);
  const std::string size = bytes >= 1 << 20 ? short_number(bytes / (1 << 20), 3) + " MiB"
                           : bytes >= 1 << 10 ? short_number(bytes / (1 << 10), 3) + " KiB"
                                              : short_number(bytes, 3) + " bytes";
  // Three digits: two wrote 100% as "1e+02%".
  return std::to_string(lost.island_params) + " parameters (" + short_number(share, 3) + "% of the model), " + size + " more";
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

/// How far each arm got from where both started. On the validation set where the evidence
/// has it: the starting weights' validation loss (computed once, in fp32) to each arm's
/// final one, the same fixed samples for both. Else on the training loss: the mean of each
/// arm's first 5 batch losses to its end (last smoothed, or a window's last 5).
struct Progress {
  double base = std::numeric_limits<double>::quiet_NaN(), mixed = base;
  double start = base;  ///< the starting validation loss (NaN: measured on the training loss)
  std::string sentence;  ///< every number named: which loss, from where, to where
  bool finite() const { return std::isfinite(base) && std::isfinite(mixed); }
};

Progress progress_of(const RuleInput& in) {
  Progress p;
  const double start = in.e.start_valid_loss;
  if (std::isfinite(start) && std::isfinite(in.base->valid_loss) && std::isfinite(in.mixed->valid_loss)) {
    p.base = start - in.base->valid_loss;
    p.mixed = start - in.mixed->valid_loss;
    p.start = start;
    p.sentence = "on the validation loss, from the starting weights' " + short_number(start) + " (the same samples for "
                 "both): " + in.mixed_name + " " + short_number(in.mixed->valid_loss) + ", fp32 " +
                 short_number(in.base->valid_loss);
    return p;
  }
  p.base = in.base->first_loss - in.base->final_loss;
  p.mixed = in.mixed->first_loss - in.mixed->final_loss;
  p.sentence = "on the training loss, the mean of the first 5 batches to the " +
               std::string(in.e.branched ? "mean of the last 5" : "last smoothed value") + ": " + in.mixed_name + " " +
               short_number(in.mixed->first_loss) + " -> " + short_number(in.mixed->final_loss) + ", fp32 " +
               short_number(in.base->first_loss) + " -> " + short_number(in.base->final_loss);
  return p;
}

// The share of updates rounded away is large, and the run made clearly less
// progress than fp32 did (a fine-tune at a tiny lr moves the loss little: the final
// losses alone would hide it, and its batch noise hides it in the training loss).
std::optional<Ruling> updates_round_away(RuleInput& in) {
  if (!in.base || !in.mixed || !in.mixed->lost) return std::nullopt;
  const LostUpdateReport& lost = *in.mixed->lost;
  if (lost.intended == 0 || lost.fraction < kLostUpdatesProblem) return std::nullopt;
  const Progress progress = progress_of(in);
  const bool gap_problem = in.gap && *in.gap > kGapPercentProblem;
  const bool material = !std::isfinite(progress.start) ||
                        progress.base - progress.mixed > kProgressShortfallNoisePercent / 100 * std::abs(progress.start);
  const bool less_progress = progress.finite() && progress.base > 0 &&
                             progress.mixed < (1 - kGapPercentProblem / 100) * progress.base && material;
  if (!gap_problem && !less_progress) return std::nullopt;
  Ruling r;
  if (progress.finite() && progress.base > 0)
    r.findings.push_back(in.mixed_name + " made " + short_number(100 * progress.mixed / progress.base, 3) +
                         "% of fp32's progress " + progress.sentence);
  r.findings.push_back(pct(lost.fraction) + " of the weights' element updates rounded to no change (" + lost.rule +
                       " rounding); what rounding dropped is " + pct(lost.norm_ratio) + " of the intended update's norm");
  if (lost.fraction_per_epoch.size() > 1) {
    std::string epochs;
    for (size_t i = 0; i < lost.fraction_per_epoch.size(); ++i) epochs += (i ? ", " : "") + pct(lost.fraction_per_epoch[i]);
    r.findings.push_back("lost per epoch: " + epochs + " (the schedule's low-lr end loses most)");
  }
  for (size_t i = 0; i < lost.worst.size() && i < 3; ++i) {
    const auto& p = lost.worst[i];
    r.findings.push_back(p.name + " (" + std::to_string(p.numel) + " elements): " + pct(p.fraction) + " lost" +
                         (p.never_moved ? ", never moved" : "") + "; typical |w| " + short_number(p.mean_abs_weight) +
                         " against a typical update " + short_number(p.rms_update) +
                         " (bf16 keeps an update above about |w| / 256)");
  }
  r.fixes.push_back("round the update stochastically (" + Phrase::setting("weight_update", "stochastic") +
                    "): unbiased, no extra memory");
  r.fixes.push_back("carry what rounding drops to the next step (" + Phrase::setting("weight_update", "kahan") +
                    "): 2 more bytes per parameter");
  if (!lost.islands.empty())
    r.fixes.push_back("keep " + joined(lost.islands) + " in fp32 (" + Phrase::setting("keep_fp32", joined(lost.islands)) +
                      "): they lost nearly every update; in fp32 they learn, for " + island_cost(lost));
  r.fixes.push_back("keep fp32 weights: " + Phrase::setting("precision", "bf16-master") + " (fp32 masters) or " +
                    Phrase::setting("precision", "bf16") + " (autocast), about twice the memory");
  r.headline = "lost_updates: " + in.mixed_name + " learns less than fp32: " + pct(lost.fraction) +
               " of its weight updates round to nothing";
  return r;
}

// The cures, cheapest first: stochastic rounding, islands for the modules that lost
// nearly every update (before Kahan when they cost less than its 2 bytes a parameter),
// Kahan, fp32 weights (masters, then autocast). The proven fix is the
// cheapest that trains like fp32.
std::vector<Fix> lost_updates_trials(const Diagnosis& d, const CompareOptions&) {
  // What each costs beyond bf16-pure, at least: Kahan's compensation 2 bytes a parameter;
  // fp32 masters a 4-byte copy; autocast fp32 weights and gradients (2 + 2 more).
  std::vector<Fix> out{{"round the update stochastically", {{"weight_update", "stochastic"}}, 0},
                       {"Kahan-compensated updates", {{"weight_update", "kahan"}}, 2}};
  if (d.evidence.mixed && d.evidence.mixed->lost && !d.evidence.mixed->lost->islands.empty()) {
    const LostUpdateReport& lost = *d.evidence.mixed->lost;
    const double island_bytes =
        lost.params > 0 ? static_cast<double>(lost.island_extra_bytes) / static_cast<double>(lost.params) : 0;
    const Fix island{"keep " + joined(lost.islands) + " in fp32", {{"keep_fp32", joined(lost.islands)}}, island_bytes};
    // Cheapest first: an island that costs less than Kahan's 2 bytes a parameter goes before it.
    const bool cheaper_than_kahan = lost.params > 0 && lost.island_extra_bytes < 2 * lost.params;
    out.insert(out.begin() + (cheaper_than_kahan ? 1 : 2), island);
  }
  out.push_back({"fp32 master weights", {{"precision", "bf16-master"}, {"weight_update", "nearest"}}, 4});
  out.push_back({"bf16 autocast with fp32 weights", {{"precision", "bf16"}, {"weight_update", "nearest"}}, 4});
  return out;
}

// ---- underflow: it runs, but learns less than fp32 ------------------------------

std::optional<Ruling> learns_less(RuleInput& in) {
  const Evidence& e = in.e;
  const ScaleAnalysis* s = in.mixed ? &in.mixed->scale : nullptr;
  const bool gap_problem = in.gap && *in.gap > kGapPercentProblem;
  const bool skip_problem = s && skips_are_a_problem(*s);
  const bool pinned = s && s->pinned_at_min_with_flat_loss;
  const bool flushes = e.gradients && e.gradients->underflow > kUnderflowProblem;
  if (!(gap_problem || skip_problem || pinned || flushes)) return std::nullopt;
  Ruling r;
  if (gap_problem) {
    const auto [b, m] = compared_losses(*in.base, *in.mixed);
    r.findings.push_back(in.mixed_name + " plateaus above fp32: final loss " + short_number(m) + " vs " + short_number(b) +
                         " (" + short_number(*in.gap, 3) + "% worse)");
  }
  if (e.gradients)
    r.findings.push_back(pct(e.gradients->underflow) + " of nonzero gradient elements flush to zero in fp16 at scale " +
                         short_number(e.gradients->scale) +
                         (e.gradients->params.empty() ? std::string()
                                                      : " (worst: " + e.gradients->params.front().name + ", " +
                                                            pct(e.gradients->params.front().underflow) + ")"));
  if (pinned) r.findings.push_back("the loss scale sits at its minimum while the loss is flat");
  if (skip_problem) r.findings.push_back("too many skipped steps: " + pct(s->skip_rate) + " of the optimizer steps did nothing");
  r.gap_said = gap_problem;
  // Targeted fixes first, when the measurements point at the scaler itself; then
  // the guide's fix for underflow (bf16). The targeted ones go beyond the guide.
  // When gradients flush and none overflows, the measured gradients say how far
  // the scale can safely go up.
  if (e.gradients && e.gradients->underflow > 0.01 && e.gradients->overflow == 0 && s && s->skipped == 0) {
    const double largest = largest_gradient(*e.gradients);
    if (largest > 0) {
      const double safe = roomy_scale(*e.gradients, 0);
      if (safe >= 4 * e.gradients->scale)
        r.fixes.push_back("raise the loss scale: at " + short_number(e.gradients->scale) + " " + pct(e.gradients->underflow) +
                          " of gradients flush to zero, and the largest gradient (" + short_number(largest) +
                          ") leaves room up to " + short_number(safe) + " (" +
                          Phrase::setting("init_scale", short_number(safe)) + ")");
    }
  }
  if (skip_problem && s->settling_steps * 2 >= s->skipped)
    r.fixes.push_back("start the scaler lower: the first " + std::to_string(s->settling_steps) +
                      " steps were skipped backing off from " + short_number(s->initial_scale) + " to " +
                      short_number(s->settled_scale) + " (" + Phrase::setting("init_scale", short_number(s->settled_scale)) + ")");
  else if (skip_problem)
    r.fixes.push_back("if steps are skipped: lower the learning rate or clip gradients (" + Phrase::setting("clip", "1") + ")");
  r.fixes.push_back("this model needs fp32's range: prefer bf16 (" + Phrase::setting("precision", "bf16") +
                    ": fp32's exponent range, half the memory) over fighting the scaler");
  r.fixes.push_back("or stay in fp32");
  r.headline = "underflow: " + in.mixed_name + " learns less than fp32" +
               (gap_problem ? " (final loss " + short_number(*in.gap, 3) + "% higher)" : std::string());
  return r;
}

// A higher initial scale, a shorter growth interval, bf16.
std::vector<Fix> underflow_trials(const Diagnosis& d, const CompareOptions& o) {
  if (!uses_grad_scaler(o)) return {};
  const Evidence& e = d.evidence;
  const double now = e.gradients ? e.gradients->scale : e.mixed ? e.mixed->scale.final_scale : amp::kDefaultInitScale;
  const double safe = e.gradients ? roomy_scale(*e.gradients, amp::kDefaultInitScale) : amp::kDefaultInitScale;
  return {{"raise the loss scale", {{"init_scale", trial_number(std::max(safe, 4 * now))}}},
          {"grow the scale sooner", {{"growth_interval", "100"}}},
          bf16_trial()};
}

// ---- healthy: none of the above ------------------------------------------------

std::optional<Ruling> trains_like_fp32(RuleInput& in) {
  Ruling r;
  r.headline = "healthy: " + in.mixed_name + " trains like fp32" +
               (in.gap ? " (final loss within " + short_number(std::abs(*in.gap), 2) + "%)" : std::string());
  // Healthy, and still worth knowing: updates bf16 rounded away at no cost here, and
  // parameters that never moved (a fresh norm gain stays exactly 1.0 in bf16).
  if (in.mixed && in.mixed->lost && in.mixed->lost->intended > 0) {
    const LostUpdateReport& lost = *in.mixed->lost;
    if (!lost.keeps_dropped && lost.fraction >= kLostUpdatesProblem) {
      const Progress progress = in.base ? progress_of(in) : Progress{};
      r.findings.push_back(pct(lost.fraction) + " of single weight updates rounded away in bf16, at no cost here: " +
                           in.mixed_name + " made " +
                           (progress.finite() && progress.base > 0
                                ? short_number(100 * progress.mixed / progress.base, 3) + "% of fp32's progress " + progress.sentence
                                : std::string("the progress fp32 made")));
    }
    std::vector<std::string> never;
    for (const auto& p : lost.worst)
      if (p.never_moved) never.push_back(p.name);
    if (!never.empty())
      r.findings.push_back("never moved (still their initial values): " + joined(never) +
                           (lost.islands.empty() ? Phrase()
                                                 : "; in fp32 they would learn (" + Phrase::setting("keep_fp32", joined(lost.islands)) +
                                                       ", " + island_cost(lost) + ")"));
  }
  return r;
}

} // namespace

const std::vector<VerdictEntry>& catalogue() {
  static const std::vector<VerdictEntry> kCatalogue = {
      {Verdict::kUnsupported, "unsupported", {cannot_run}, nullptr},
      {Verdict::kBrokenInFp32, "broken_in_fp32", {baseline_fails}, nullptr},
      {Verdict::kForwardOverflow, "forward_overflow", {activation_overflows}, forward_overflow_trials},
      {Verdict::kGradientOverflow, "gradient_overflow", {backoff_never_settled, gradients_keep_overflowing},
       gradient_overflow_trials},
      {Verdict::kLostUpdates, "lost_updates", {updates_round_away}, lost_updates_trials},
      {Verdict::kUnderflow, "underflow", {learns_less}, underflow_trials},
      {Verdict::kHealthy, "healthy", {trains_like_fp32}, nullptr},
  };
  return kCatalogue;
}

std::optional<HeadStart> head_start(const CompareOptions& o) {
  if (o.max_trials() <= 0 || !o.apply_setting()) return std::nullopt;
  if (o.precision() != Precision::kBf16Pure || o.precision_options().weight_update() != amp::WeightUpdate::kNearest)
    return std::nullopt;
  // updates_round_away's first condition: a quarter of the updates lost. Its second, less
  // progress than fp32, often shows only late in a schedule (the low-lr end loses most).
  const auto losing_updates = [](const RunEvidence& run) {
    return run.lost && !run.lost->keeps_dropped && run.lost->intended > 0 && run.lost->fraction >= kLostUpdatesProblem;
  };
  // Its first fix never depends on the evidence (islands, which do, go after it).
  return HeadStart{Verdict::kLostUpdates, lost_updates_trials(Diagnosis{}, o).front(), losing_updates};
}

const VerdictEntry& entry(Verdict verdict) {
  for (const auto& e : catalogue())
    if (e.verdict == verdict) return e;
  TORCH_INTERNAL_ASSERT(false, "a Verdict without a catalogue entry: ", static_cast<int>(verdict));
}

} // namespace mixtrain::diagnose::detail
