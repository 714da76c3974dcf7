#include "mixtrain/diagnose/diagnosis.h"

#include "diagnose/catalogue.h"
#include "util/json_number.h"
#include "util/short_number.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace mixtrain::diagnose {

const char* to_string(Verdict verdict) { return detail::entry(verdict).name; }

namespace {

using detail::compared_losses;
using detail::pct;
using mixtrain::detail::short_number;

/// A proven fix in the library's words: the calls, joined.
std::string api_of(const Trial& t) {
  std::string out;
  for (const auto& st : t.settings) out += (out.empty() ? "" : "; ") + api_words().setting(st.key, st.value);
  return out;
}

const OpFinding* first_overflow(const Evidence& e) {
  if (e.trace_start && e.trace_start->first_overflow) return &*e.trace_start->first_overflow;
  if (e.trace_end && e.trace_end->first_overflow) return &*e.trace_end->first_overflow;
  return nullptr;
}

/// Context that is not the deciding evidence but helps a reader, after the verdict's own findings.
void add_context(const detail::RuleInput& in, Verdict v, bool gap_said, std::vector<Phrase>& findings) {
  const Evidence& e = in.e;
  if (!in.weak_baseline.empty() && v != Verdict::kHealthy) findings.push_back(in.weak_baseline);
  if (!in.weak_baseline_healthy.empty() && v == Verdict::kHealthy) findings.push_back(in.weak_baseline_healthy);
  if (in.base && in.mixed && in.gap && !gap_said) {
    const auto [b, m] = compared_losses(*in.base, *in.mixed);
    // Which loss it is, by name: the validation loss when both runs have one, else the training loss.
    const bool valid = std::isfinite(in.base->valid_loss) && std::isfinite(in.mixed->valid_loss);
    findings.push_back(std::string(valid ? "final validation loss" : "final training loss") + ": fp32 " + short_number(b) +
                       ", " + in.mixed_name + " " + short_number(m) + " (gap " + short_number(*in.gap, 3) + "%)");
  }
  if (in.mixed && in.mixed->scale.has_scale && v != Verdict::kGradientOverflow)
    findings.push_back(detail::scale_sentence(in.mixed->scale));
  if (e.gradients && v != Verdict::kUnderflow)
    findings.push_back("gradients at scale " + short_number(e.gradients->scale) + ": " + pct(e.gradients->underflow) +
                       " would flush to zero in fp16, " + pct(e.gradients->overflow) + " would overflow");
  const OverflowTrace* t = e.trace_start ? &*e.trace_start : nullptr;
  if (t && !t->at_risk.empty() && v != Verdict::kForwardOverflow)
    findings.push_back("at risk (fp16 outputs above 2^14): " + t->at_risk.front().where() + " reaches " +
                       short_number(t->at_risk.front().max_abs));
  if (e.inputs)
    for (const auto& f : e.inputs->findings) {
      const std::string line = "input check: " + f;
      if (std::none_of(findings.begin(), findings.end(), [&](const Phrase& p) { return p.str() == line; }))
        findings.push_back(line);
    }
}

} // namespace

std::optional<double> Evidence::gap_percent() const {
  if (!fp32 || !mixed) return std::nullopt;
  const auto [base, run] = compared_losses(*fp32, *mixed);
  if (!std::isfinite(base) || !std::isfinite(run) || base == 0) return std::nullopt;
  return (run - base) / std::abs(base) * 100;
}

Diagnosis decide(Evidence e) {
  detail::RuleInput in{e, nullptr, nullptr, {}, std::nullopt, {}};
  in.base = e.fp32 ? &*e.fp32 : nullptr;
  in.mixed = e.mixed ? &*e.mixed : nullptr;
  in.mixed_name = in.mixed ? in.mixed->precision : "mixed precision";
  in.gap = e.gap_percent();
  for (const detail::VerdictEntry& entry : detail::catalogue())
    for (const detail::Rule rule : entry.rules) {
      std::optional<detail::Ruling> r = rule(in);
      if (!r) continue;
      Diagnosis d;
      d.verdict = entry.verdict;
      d.headline = std::move(r->headline);
      d.findings = std::move(r->findings);
      d.fixes = std::move(r->fixes);
      add_context(in, d.verdict, r->gap_said, d.findings);
      d.evidence = std::move(e);
      return d;
    }
  TORCH_INTERNAL_ASSERT(false, "no verdict's rule held (healthy's always does)");
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
                   {"first_nonfinite_step", s.first_nonfinite_step},
                   {"bytes_per_param", json_number(r.bytes_per_param)}};
  if (r.lost)
    j["lost_updates"] = {{"weight_update", r.lost->rule}, {"fraction", r.lost->fraction},
                         {"norm_ratio", r.lost->norm_ratio}, {"per_epoch", r.lost->fraction_per_epoch},
                         {"means", lost_updates_meaning(r.lost->rule)}};
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

namespace {
/// A trial's settings by option key, as the run configuration reads them (front ends render their own lines).
nlohmann::json settings_json(const std::vector<Setting>& settings) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : settings) j.push_back({{"key", s.key}, {"value", s.value}});
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
  if (std::isfinite(e.start_valid_loss)) ev["start_valid_loss"] = e.start_valid_loss;
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
                          {"settings", settings_json(t.settings)},
                          {"finite", t.finite},
                          {"skipped", t.skipped},
                          {"gap_percent", t.gap_percent ? nlohmann::json(*t.gap_percent) : nlohmann::json(nullptr)},
                          {"seconds", t.seconds},
                          {"head_start", t.head_start},
                          {"bytes_per_param", json_number(t.run.bytes_per_param)},
                          {"verdict", to_string(t.verdict)},
                          {"error", t.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(t.error)},
                          {"proven", t.proven()}};
  };
  for (const auto& t : trials) j["trials"].push_back(trial_json(t));
  j["trials_status"] = trials_status;
  if (!timing.empty()) {
    nlohmann::json t = nlohmann::json::object();
    for (const auto& [phase, seconds] : timing) t[phase] = seconds;
    j["timing"] = t;
  }
  j["trials_stopped"] = trials_stopped.empty() ? nlohmann::json(nullptr) : nlohmann::json(trials_stopped);
  j["proven_fix"] = proven_fix ? trial_json(trials[*proven_fix]) : nlohmann::json(nullptr);
  if (replay) {
    const Replay& r = *replay;
    j["replay"] = {{"from", r.from},
                   {"checkpoint", r.checkpoint},
                   {"step", r.step >= 0 ? nlohmann::json(r.step) : nlohmann::json(nullptr)},
                   {"window", r.window},
                   {"matches_run", r.matches_run ? nlohmann::json(*r.matches_run) : nlohmann::json(nullptr)},
                   {"first_difference", r.first_difference >= 0 ? nlohmann::json(r.first_difference) : nlohmann::json(nullptr)},
                   {"difference", r.difference.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.difference)},
                   {"not_compared", r.not_compared.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.not_compared)},
                   {"seconds", r.seconds},
                   {"restore_seconds", r.restore_seconds},
                   {"fp32_arm_seconds", r.fp32_arm_seconds},
                   {"notes", r.notes},
                   {"run_record", r.record}};
  }
  return j.dump(2) + "\n";
}

std::string Trial::settings_in(const OptionWords& words) const {
  std::string out;
  for (const auto& st : settings) out += (out.empty() ? "" : " ") + words.setting(st.key, st.value);
  return out;
}

std::string Diagnosis::report(const OptionWords& words) const {
  std::ostringstream out;
  if (replay) {
    const Replay& r = *replay;
    // A replay that is not the run comes first: the verdict below is about another run.
    if (r.matches_run && !*r.matches_run)
      out << "WARNING: the replay does not match the run from step " << r.first_difference << " (" << r.difference
          << "): the verdict is about a different run than the one recorded\n";
    if (!r.record.empty()) {
      out << "the run's own record (" << r.from << "):\n";
      for (const auto& line : r.record) out << "  - " << line << "\n";
    }
    const bool loop = r.from.empty();  // a training loop's state (Python's optimizer=), not a run folder
    out << "replayed from " << r.checkpoint << (r.step >= 0 ? " (step " + std::to_string(r.step) + ")" : std::string()) << ", "
        << r.window << (loop ? " steps in fp32 and in the loop's precision, same batches at the optimizer's lr; replay "
                             : " steps in fp32 and in the run's precision, same batches and schedule; replay ")
        << (!r.matches_run ? "not checked against the run: " + r.not_compared
            : *r.matches_run ? std::string("matches the run's steps.csv")
                             : "differs from the run at step " + std::to_string(r.first_difference))
        << "\n";
    for (const auto& note : r.notes) out << "  note: " << note << "\n";
  }
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
    out << (replay ? "trials (each the window again with one fix, from the same checkpoint, on the same batches):\n"
                   : "trials (each the mixed run again with one fix, same weights, seed and data order):\n");
    char line[512];
    std::snprintf(line, sizeof(line), "  %-44s %-8s %-8s %-9s %-12s %s\n", "fix", "finite", "skipped", "gap", "bytes/param",
                  "seconds");
    out << line;
    for (const auto& t : trials) {
      const std::string gap = t.gap_percent ? short_number(*t.gap_percent, 3) + "%" : "-";
      const std::string bytes = std::isfinite(t.run.bytes_per_param) ? short_number(t.run.bytes_per_param, 3) : "-";
      std::snprintf(line, sizeof(line), "  %-44s %-8s %-8lld %-9s %-12s %.1f  %s\n", t.settings_in(words).c_str(),
                    t.finite ? "yes" : "no", static_cast<long long>(t.skipped), gap.c_str(), bytes.c_str(), t.seconds,
                    t.proven() ? "proven" : !t.error.empty() ? ("failed: " + t.error).c_str() : to_string(t.verdict));
      out << line;
    }
    if (proven_fix) {
      const Trial& t = trials[*proven_fix];
      out << "proven fix: " << t.fix.str(words) << "\n  flags: " << t.settings_in(words) << "\n  library: " << api_of(t)
          << "\n";
      if (!trials_stopped.empty()) out << "trials stopped: " << trials_stopped << "\n";
    } else {
      out << "proven fix: none: no trial trained like fp32 by the verdict's rules\n";
    }
  }
  return out.str();
}

} // namespace mixtrain::diagnose
