#pragma once
// The catalogue of verdicts: one entry per verdict, holding its name, its rules
// (the evidence that decides it, the findings and fixes it states) and the trials
// that prove its fixes (each a Phrase and the option settings that make the run).
// decide() walks the entries in order; compare() asks the verdict's entry what to
// try. A new verdict is a Verdict value and one entry here (ARCHITECTURE.md).

#include "mixtrain/diagnose/compare.h"
#include "mixtrain/diagnose/diagnosis.h"

#include <optional>
#include <string>
#include <vector>

namespace mixtrain::diagnose::detail {

/// What a rule reads: the evidence, and what the rules before it found.
struct RuleInput {
  const Evidence& e;
  const RunEvidence* base = nullptr;   ///< the fp32 run, if any
  const RunEvidence* mixed = nullptr;  ///< the mixed run, if any
  std::string mixed_name;              ///< "fp16", "bf16" (or "mixed precision")
  std::optional<double> gap;           ///< Evidence::gap_percent()
  /// Set by the baseline rule when fp32 is weak but not the cause; the verdict
  /// that follows states it.
  std::string weak_baseline;
  /// Set with it: what a healthy verdict on that weak baseline says (a comparison
  /// with a baseline that learned little says little).
  Phrase weak_baseline_healthy;
};

/// An fp32 baseline that fails this badly is broken whatever the mixed run does
/// (the seed guide's first step: "if fp32 also fails, fix that first"): its
/// validation loss ends above kValidLossDiverged times its starting train loss
/// (orders of magnitude, not kValidLossFarAbove's 3x), or its validation accuracy
/// below kFarBelowChanceFactor times chance.
constexpr double kValidLossDiverged = 100.0;
constexpr double kFarBelowChanceFactor = 0.5;

/// What a rule says when it holds.
struct Ruling {
  std::string headline;
  std::vector<Phrase> findings;  ///< the deciding evidence, most telling first
  std::vector<Phrase> fixes;     ///< most targeted first
  bool gap_said = false;         ///< the findings already state the loss gap
};

using Rule = std::optional<Ruling> (*)(RuleInput&);
using TrialsFor = std::vector<Fix> (*)(const Diagnosis&, const CompareOptions&);

struct VerdictEntry {
  Verdict verdict;
  const char* name;          ///< diagnosis.json's and the report's word
  std::vector<Rule> rules;   ///< tried in order; the first that holds decides
  TrialsFor trials;          ///< the fixes worth a trial run (nullptr: none can be tried)
};

/// Every verdict, in the order their rules are tried: unsupported,
/// broken_in_fp32, forward_overflow, gradient_overflow, lost_updates, underflow,
/// healthy (whose rule always holds).
const std::vector<VerdictEntry>& catalogue();
/// The entry of `verdict`.
const VerdictEntry& entry(Verdict verdict);

/// A trial worth starting before the verdict is known: the first fix `verdict` tries,
/// whatever the evidence says. compare() starts it on the thread the fp32 baseline left
/// free once `likely` holds for the run under diagnosis so far, and keeps it if the
/// verdict agrees (a start the verdict does not take only used a core that was idle).
struct HeadStart {
  Verdict verdict;
  Fix fix;
  /// The verdict's first condition, on the run's steps so far.
  bool (*likely)(const RunEvidence& run_so_far) = nullptr;
};
/// The head start the run `o` describes can take: lost_updates' stochastic rounding for
/// bf16-pure rounding to nearest (the one verdict whose first trial needs no evidence);
/// none for any other run, or when `o` runs no trials.
std::optional<HeadStart> head_start(const CompareOptions& o);

/// The loss both runs are compared on: validation when both have one, else train.
std::pair<double, double> compared_losses(const RunEvidence& a, const RunEvidence& b);
/// "12 of 40 steps skipped (30%; per epoch: ...); loss scale 1.6e+07 -> 256 (...)".
std::string scale_sentence(const ScaleAnalysis& s);
/// A fraction as a percentage, 3 significant digits.
std::string pct(double fraction);

} // namespace mixtrain::diagnose::detail
