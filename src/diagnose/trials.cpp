// Running the doctor's arms and trials (trials.h): a fit as the comparison runs it, the
// probe batch, and the fixes tried one by one, withdrawn when their trial fails, and settled.
#include "trials.h"

#include "catalogue.h"
#include "side_by_side.h"
#include "util/comma_list.h"
#include "util/first_line.h"

#include "mixtrain/callbacks/stop_on_request.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/diagnose/overflow_trace.h"
#include "mixtrain/diagnose/trial_stop.h"
#include "mixtrain/models/failure_site.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>

namespace mixtrain::diagnose::detail {

void fit(Learner& learn, const CompareOptions& o, bool seed) {
  if (seed) torch::manual_seed(o.seed());  // dropout and anything else drawing from the global generator
  if (o.one_cycle())
    learn.fit_one_cycle(o.epochs(), o.lr());
  else
    learn.fit(o.epochs(), o.lr());
}

data::Batch probe_batch(Learner& learn) {
  return data::Batch::head_of(learn.dls().train.dataset(), std::max<int64_t>(1, learn.dls().train.options().batch_size()));
}

void restore_state(Learner& learn, const std::vector<torch::Tensor>& initial) {
  torch::NoGradGuard no_grad;
  const auto state = learn.model().state_tensors();
  for (size_t i = 0; i < state.size() && i < initial.size(); ++i) state[i].copy_(initial[i]);
}

bool same_settings(const std::vector<Setting>& a, const std::vector<Setting>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const Setting& x, const Setting& y) { return x.key == y.key && x.value == y.value; });
}

std::vector<Fix> trial_queue(const Diagnosis& d, const CompareOptions& o) {
  const TrialsFor trials = entry(d.verdict).trials;
  if (o.max_trials() <= 0 || !o.apply_setting() || !trials) return {};
  return trials(d, o);
}

std::string first_overflow_island(Learner& learn) {
  const OverflowTrace trace = trace_overflow(learn, probe_batch(learn));
  return trace.first_overflow ? trace.first_overflow->island() : std::string();
}

MixedRun run_with(const CompareOptions& o, const Fix& c) {
  MixedRun t{o.precision(), o.precision_options(), 0};
  for (const auto& st : c.settings) o.apply_setting()(st, t);
  return t;
}

namespace {

Trial run_trial(const TrialRunner& runner, const CompareOptions& o, const Evidence& measured, const Fix& c,
                std::string* next_overflow) {
  const MixedRun t = run_with(o, c);
  const auto start = std::chrono::steady_clock::now();
  Trial r;
  r.fix = c.fix;
  r.settings = c.settings;
  r.run = runner(t, mode_of(t.precision).traces_overflow ? next_overflow : nullptr);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Evidence e;
  e.fp32 = measured.fp32;
  e.mixed = r.run;
  e.branched = measured.branched;
  e.start_valid_loss = measured.start_valid_loss;
  r.finite = r.run.scale.nonfinite_losses == 0 && std::isfinite(r.run.final_loss);
  r.skipped = r.run.scale.skipped;
  r.gap_percent = e.gap_percent();
  r.verdict = decide(std::move(e)).verdict;
  return r;
}

/// A fix whose own trial could not run on this model is not recommended: it moves
/// from the fixes to the findings, with the trial's error. (A fix names a trial when
/// it names the trial's first setting, the one that defines it.)
void withdraw_failed_fixes(Diagnosis& d) {
  std::vector<Phrase> kept;
  for (const Phrase& fix : d.fixes) {
    const Trial* failed = nullptr;
    bool ran = false;
    for (const Trial& t : d.trials) {
      if (t.settings.empty() || !fix.names_setting(t.settings[0].key, t.settings[0].value)) continue;
      if (t.error.empty())
        ran = true;
      else if (!failed)
        failed = &t;
    }
    if (failed && !ran)
      d.findings.push_back("not recommended: " + fix + "; its trial failed on this model: " + failed->error);
    else
      kept.push_back(fix);
  }
  d.fixes = std::move(kept);
}

/// What the trials so far prove: failed fixes withdrawn, and the proven fix chosen.
void settle(Diagnosis& d) {
  withdraw_failed_fixes(d);
  // The proven fix: the cheapest healthy trial in bytes per parameter; among equally
  // cheap ones (the autocast modes all cost the same) the first tried, the most targeted,
  // unless another's gap to fp32 is smaller by more than noise. Gaps a fraction of a
  // percent apart are rounding noise and would make the choice depend on the CPU (real
  // bf16 kernels or their emulation).
  auto cost = [](const Trial& t) { return std::isfinite(t.run.bytes_per_param) ? t.run.bytes_per_param : 1e300; };
  auto gap = [](const Trial& t) { return t.gap_percent ? std::abs(*t.gap_percent) : 0.0; };
  for (size_t i = 0; i < d.trials.size(); ++i) {
    const Trial& t = d.trials[i];
    if (!t.proven()) continue;
    if (!d.proven_fix) {
      d.proven_fix = i;
      continue;
    }
    const Trial& best = d.trials[*d.proven_fix];
    if (cost(t) < cost(best) - 1e-9 || (std::abs(cost(t) - cost(best)) <= 1e-9 && gap(t) < gap(best) - kGapNoisePercent))
      d.proven_fix = i;
  }
}

} // namespace

void report_progress(const Diagnosis& d, const CompareOptions& o) {
  if (!o.on_progress()) return;
  Diagnosis now = d;
  settle(now);
  now.trials_status = "running";
  o.on_progress()(now);
}

void try_fixes(Diagnosis& d, const TrialRunner& runner, const CompareOptions& o, HeadStartTrial* head) {
  std::vector<Fix> queue = trial_queue(d, o);
  const bool adopt = head && head->kept() && !queue.empty() && same_settings(queue[0].settings, head->what().fix.settings);
  bool head_trained = false;
  const TrialRunner head_runner = [&](const MixedRun& t, std::string* next_overflow) {
    if (std::optional<RunEvidence> r = head->result()) {
      head_trained = true;
      return *r;
    }
    return runner(t, next_overflow);
  };
  // Islands grow while a trial still overflows elsewhere, up to the trial budget.
  for (size_t i = 0; i < queue.size() && static_cast<int64_t>(d.trials.size()) < o.max_trials(); ++i) {
    const Fix c = queue[i];
    const bool island = !c.settings.empty() && c.settings[0].key == "keep_fp32";
    std::string next;
    const bool early = adopt && i == 0;
    std::cout << "doctor: trial " << d.trials.size() + 1 << ": " << c.fix.str()
              << (early ? " (trained before the verdict, after the fp32 baseline)" : "") << std::endl;
    try {
      d.trials.push_back(run_trial(early ? head_runner : runner, o, d.evidence, c, island ? &next : nullptr));
      if (early && head_trained) {
        d.trials.back().seconds = head->seconds();
        d.trials.back().head_start = true;
      }
    } catch (const callbacks::StopRequested&) {  // the user's stop is not a failed trial
      throw;
    } catch (const std::exception& e) {  // a fix this model cannot take: the trial failed, and says why
      Trial failed;
      failed.fix = c.fix;
      failed.settings = c.settings;
      failed.error = innermost_message(e);
      failed.verdict = d.verdict;
      d.trials.push_back(std::move(failed));
      std::cout << "doctor: trial failed: " << d.trials.back().error << std::endl;
      report_progress(d, o);
      continue;
    }
    report_progress(d, o);
    const Trial& t = d.trials.back();
    const double run_bytes = d.evidence.mixed ? d.evidence.mixed->bytes_per_param : NAN;
    const std::vector<Fix> waiting(queue.begin() + static_cast<std::ptrdiff_t>(i) + 1, queue.end());
    d.trials_stopped = why_trials_stop(t, run_bytes, waiting);
    if (!d.trials_stopped.empty()) break;
    if (island && !t.proven() && !next.empty()) {
      std::vector<std::string> names = mixtrain::detail::comma_list(c.settings[0].value);
      if (std::find(names.begin(), names.end(), next) == names.end()) {
        names.push_back(next);
        const std::string islands = mixtrain::detail::comma_joined(names);
        queue.insert(queue.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                     Fix{"keep " + islands + " in fp32", {{"keep_fp32", islands}}});
      }
    }
  }
  settle(d);
}

} // namespace mixtrain::diagnose::detail
