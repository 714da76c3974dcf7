#pragma once
/// Verdicts: the failure classes of fp16 training (forward overflow, gradient
/// overflow, underflow, unsupported setups, a baseline that fails in fp32 too),
/// decided from measurements, with the evidence behind them and the fixes, most
/// targeted first. Fixes and findings name options by key (mixtrain/phrase.h),
/// so each front end prints them in its own words.

#include "mixtrain/diagnose/gradient_health.h"
#include "mixtrain/diagnose/input_check.h"
#include "mixtrain/diagnose/overflow_trace.h"
#include "mixtrain/diagnose/scale_analysis.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/util/phrase.h"

#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain::diagnose {

enum class Verdict {
  kHealthy,           ///< mixed precision trains like fp32
  kForwardOverflow,   ///< an fp16 activation overflows (NaN within the first epoch)
  kGradientOverflow,  ///< gradients keep overflowing; the scale collapses
  kUnderflow,         ///< loss plateaus above fp32, or too many skipped steps
  kUnsupported,       ///< this precision cannot run here
  kBrokenInFp32,      ///< the fp32 baseline fails too: the model or data is the problem
  kLostUpdates,       ///< 16-bit weights (bf16-pure) round their updates away and learn less than fp32
};

/// "healthy", "forward_overflow", "gradient_overflow", "underflow", "unsupported",
/// "broken_in_fp32", "lost_updates".
const char* to_string(Verdict verdict);

// Thresholds of the rules in decide().
/// A mixed-precision final loss this many percent above fp32's is a real gap
/// (the fp16 troubleshooting guide: "a few percent can be normal fp16 noise; a large gap is a real problem").
constexpr double kGapPercentProblem = 10.0;
/// Gaps to fp32 closer than this (in percentage points) are noise when choosing between
/// equally cheap proven fixes: the first tried (the most targeted) is kept.
constexpr double kGapNoisePercent = 1.0;
/// A bf16-pure run "learns less" on the validation loss only when it falls short of fp32's
/// progress by more than this percentage of the starting validation loss as well: a run
/// computed in bf16 (8 bits of mantissa, 0.39% spacing) cannot show a smaller difference
/// as evidence, and a stochastically rounded run's noise is of that size at a tiny lr.
constexpr double kProgressShortfallNoisePercent = 0.5;
/// Skipping more than this fraction of steps is a problem (also the end-of-fit warning's threshold).
constexpr double kSkipRateProblem = 0.05;
/// Skipping at least this fraction means gradients overflow on most steps.
constexpr double kSkipRateMost = 0.5;
/// Fraction of nonzero gradient elements flushing to zero that makes underflow the verdict by itself.
constexpr double kUnderflowProblem = 0.5;
/// The fp32 baseline fails to learn (broken_in_fp32, whatever the mixed run did) when
/// its final train loss is not below its start (the mean of its first 5 step losses),
/// or its validation loss ends above kValidLossFarAbove times that start, or its
/// validation accuracy is at most kChanceAccuracyFactor times chance (1 / classes).
constexpr double kValidLossFarAbove = 3.0;
constexpr double kChanceAccuracyFactor = 1.5;
/// At least this share of the steps skipped while the scale was still backing off
/// from its start (no step succeeded before): the initial scale is far too high.
constexpr double kSkipRateAlmostAll = 0.9;

/// One run of the A/B pair, as the Recorder saw it.
struct RunEvidence {
  std::string precision;          ///< "fp32", "fp16" or "bf16"
  bool emulated = false;          ///< fp16 numerics emulated (CPU)
  std::vector<double> losses;     ///< per step
  std::vector<double> smooth_losses;
  std::vector<double> scales;     ///< per step (NaN without a scaler)
  std::vector<bool> skipped;
  std::vector<int64_t> epochs;    ///< per step: the epoch it belongs to
  /// The index in the run's step history (steps.csv's rows) of the first step held:
  /// 0 for a run from scratch, the branch point for a window replayed from a checkpoint.
  int64_t first_step = 0;
  /// 1 / number of classes when the targets are class indices (NaN otherwise):
  /// accuracy at or near it means the model learned nothing.
  double chance_accuracy = std::numeric_limits<double>::quiet_NaN();
  double first_loss = std::numeric_limits<double>::quiet_NaN();  ///< mean of the first (up to 5) step losses
  double final_loss = std::numeric_limits<double>::quiet_NaN();  ///< last epoch's train loss (smoothed)
  double valid_loss = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::string> metric_names;
  std::vector<double> metrics;    ///< last epoch
  ScaleAnalysis scale;
  /// Weight updates rounded away (bf16-pure), as the precision callback counted them.
  std::optional<LostUpdateReport> lost;
  /// What a parameter cost in this mode: weight, gradient, optimizer state and any
  /// master copy or compensation, in bytes (fp32 with AdamW: 16; bf16-pure: 8).
  double bytes_per_param = std::numeric_limits<double>::quiet_NaN();
};

struct Evidence {
  Phrase unsupported;                       ///< non-empty: why this precision cannot run here
  std::optional<RunEvidence> fp32;          ///< the baseline
  std::optional<RunEvidence> mixed;         ///< the fp16 (or bf16) run
  std::optional<OverflowTrace> trace_start; ///< fp16 forward pass at the initial weights
  std::optional<OverflowTrace> trace_end;   ///< and at the weights the mixed run ended with
  std::optional<GradientHealth> gradients;  ///< fp32 gradients at the mixed run's final scale
  std::optional<InputReport> inputs;        ///< the training inputs
  /// The pair is a window replayed from a run's checkpoint (mixtrain doctor --from), not
  /// two runs from scratch: a baseline whose loss does not fall in the window is no fault
  /// (a late window of a converged run), so only its divergence counts against it.
  bool branched = false;
  /// The baseline trained beside the mixed run, each on half the intra-op threads
  /// (CompareOptions::side_by_side), not the two in turn on all of them.
  bool side_by_side = false;
  /// The validation loss of the weights both arms start from, in fp32, computed once: the
  /// fixed point each arm's progress is measured from (its final validation loss against
  /// it). At a small learning rate the training loss's batch noise is larger than the
  /// progress itself, so the first and last training losses cannot show it. NaN: not measured.
  double start_valid_loss = std::numeric_limits<double>::quiet_NaN();
  /// (mixed - fp32) / |fp32| * 100 of the compared loss (valid loss when both are finite).
  std::optional<double> gap_percent() const;
};

/// One option setting a trial changes, by the run configuration's key ("keep_fp32", "conv_proj").
struct Setting {
  std::string key, value;
};

/// A fix worth a trial: what it does in words, and the option settings that make
/// the mixed run again with it. The words of every front end (flags, keywords,
/// library calls) are rendered from the settings.
struct Fix {
  Phrase fix;                     ///< "keep conv_proj in fp32"
  std::vector<Setting> settings;  ///< what it changes
  /// At least this many bytes a parameter more than the run it fixes (0: unknown, it may
  /// cost no more): once a trial is proven, the waiting fixes that cannot be cheaper are
  /// not tried.
  double min_extra_bytes = 0;
};

/// A candidate fix, tried: the mixed run again with the fix's settings, from the
/// same initial weights, seed and data order, judged by the same rules as the verdict.
struct Trial {
  Phrase fix;                     ///< "keep conv_proj in fp32"
  std::vector<Setting> settings;  ///< what it changes
  RunEvidence run;                ///< its mixed run
  bool finite = false;            ///< no NaN/inf loss
  int64_t skipped = 0;            ///< optimizer steps skipped
  std::optional<double> gap_percent;  ///< its loss against fp32's, as the verdict's gap
  double seconds = 0;
  /// Trained before the verdict, once the run so far pointed to it, on the threads the
  /// fp32 baseline left free beside the run under diagnosis (CompareOptions::side_by_side).
  bool head_start = false;
  Verdict verdict = Verdict::kHealthy;  ///< what the rules say of it (healthy: proven)
  std::string error;                     ///< non-empty: the trial could not run, and why
  bool proven() const { return error.empty() && verdict == Verdict::kHealthy; }
  /// The settings in `words`: "--keep-fp32 conv_proj --init-scale 256".
  std::string settings_in(const OptionWords& words) const;
};

/// Where a diagnosis replayed from (mixtrain doctor --from): the run's checkpoint, the
/// window, whether the replayed mixed arm is the run itself, and the run's own record.
struct Replay {
  std::string from;           ///< the run folder (empty: a training loop's state, Python's optimizer=)
  std::string checkpoint;     ///< the checkpoint branched from, in words for a loop
  int64_t step = 0;           ///< its training step (-1: not known, an SGD loop's)
  int64_t window = 0;         ///< training steps replayed in each arm
  /// The replayed mixed arm against the run's steps.csv (loss, scale, skip of every step
  /// both have): true when equal to the digit steps.csv keeps (float32's all), false from
  /// `first_difference` on, nullopt when the run recorded none of the window's steps.
  std::optional<bool> matches_run;
  int64_t first_difference = -1;  ///< the first step that differs (matches_run false)
  std::string difference;         ///< what differs there, in words
  std::string not_compared;       ///< why matches_run is nullopt
  double seconds = 0;             ///< restoring, both arms and their validations (trials apart)
  /// Of that, what the fp32 arm took to start (build the Learner, load the checkpoint, go
  /// to fp32) and then to run (the window and its validation): the branch's own cost
  /// beside the work it branches for. 0 where not measured.
  double restore_seconds = 0, fp32_arm_seconds = 0;
  /// Notes on the branch point: why this checkpoint (an earlier one than the newest).
  std::vector<std::string> notes;
  /// What the run recorded before the doctor replayed anything (its own record): the
  /// loss scale and skips per epoch, lost updates, the NaN stop's message.
  std::vector<std::string> record;
};

struct Diagnosis {
  Verdict verdict = Verdict::kHealthy;
  std::string headline;               ///< one line: the verdict in words
  std::vector<Phrase> findings;       ///< what was measured, most telling first
  std::vector<Phrase> fixes;          ///< most targeted first; empty when healthy
  Evidence evidence;
  /// The candidate fixes tried after a problem verdict (diagnose::compare), in order.
  std::vector<Trial> trials;
  /// The cheapest proven trial (fewest bytes per parameter; among equally cheap ones the
  /// first tried, unless another's gap is more than kGapNoisePercent smaller),
  /// or none: then nothing was proven.
  std::optional<size_t> proven_fix;
  /// Where the trials stand: "running" while they run (what diagnose::compare's
  /// on_progress sees), "interrupted" when a stop ended them, "done" when they ended.
  std::string trials_status = "done";
  /// Why the trials ended before the queue or max_trials did, or "": a proven fix that
  /// costs no more than the run it fixes cannot be beaten by a cheaper one still waiting.
  std::string trials_stopped;
  /// Set when the pair was replayed from a run's checkpoint (mixtrain doctor --from).
  std::optional<Replay> replay;
  /// Where the doctor's time went, in order (diagnosis.json's "timing"). From scratch:
  /// "setup" (the learners, the starting validation, the probes), "pair" (the fp32 and mixed
  /// runs, beside each other or in turn), "after" (the overflow trace at the end, gradient
  /// health, the verdict) and "trials" (each also in Trial::seconds). A replayed window
  /// (compare_branch) whose arms run in turn: "setup" (the fp32 arm's branch and the
  /// starting validation), "fp32", "run's setup" (its branch and probe), "run", "after",
  /// "trials"; with its arms side by side: "setup" (both branches, the probe), "pair",
  /// "after", "trials".
  std::vector<std::pair<std::string, double>> timing;

  bool healthy() const { return verdict == Verdict::kHealthy; }
  /// A short, readable report (what `mixtrain doctor` prints), options named in `words`.
  std::string report(const OptionWords& words = api_words()) const;
  /// {"verdict", "headline", "findings", "evidence", "fixes", "trials", "trials_status", "proven_fix"} as JSON
  /// text, options named in `words` (proven_fix also has "api", the library's words).
  std::string to_json(const OptionWords& words = api_words()) const;
};

/// The rules, on measurements alone (never on which model it is), tried in the
/// catalogue's order (src/diagnose/catalogue.cpp):
/// unsupported > broken_in_fp32 > forward_overflow > gradient_overflow > underflow > healthy.
Diagnosis decide(Evidence evidence);

} // namespace mixtrain::diagnose
