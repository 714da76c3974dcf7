#pragma once
// Private: running the doctor's arms and trials (trials.cpp): a fit as the comparison runs it,
// the probe batch, torch's generator kept, and the fixes tried, settled and stopped (the
// stopping rule itself is public: mixtrain/diagnose/trial_stop.h). compare.cpp's two
// protocols and side_by_side.cpp's pair use them.

#include "mixtrain/diagnose/compare.h"
#include "mixtrain/data/data.h"

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace mixtrain {
class Learner;
}

namespace mixtrain::diagnose::detail {

class HeadStartTrial;

/// torch's global generator as it was, put back at the end of the scope: a diagnostic
/// pass (dropout) must not move the replay's random stream off the run's.
class KeepGlobalRng {
 public:
  KeepGlobalRng() : state_(at::detail::getDefaultCPUGenerator().get_state()) {}
  ~KeepGlobalRng() {
    at::Generator global = at::detail::getDefaultCPUGenerator();
    global.set_state(state_);
  }
  KeepGlobalRng(const KeepGlobalRng&) = delete;
  KeepGlobalRng& operator=(const KeepGlobalRng&) = delete;

 private:
  torch::Tensor state_;
};

/// Trains `learn` as the comparison does (fit_one_cycle or fit), seeded first unless `seed` is false.
void fit(Learner& learn, const CompareOptions& o, bool seed = true);

/// A fixed batch for the diagnostic passes: the first samples, not the loader's
/// shuffled order (drawing from the loader would change the runs' data order).
data::Batch probe_batch(Learner& learn);

/// Copies `initial` (a model's state tensors, as Model::state_tensors lists them) into `learn`'s model.
void restore_state(Learner& learn, const std::vector<torch::Tensor>& initial);

/// Whether two fixes change the same settings, in the same order.
bool same_settings(const std::vector<Setting>& a, const std::vector<Setting>& b);

/// The fixes `d`'s verdict would try, cheapest first (none when `o` runs no trials).
std::vector<Fix> trial_queue(const Diagnosis& d, const CompareOptions& o);

/// The mixed run as fix `c`'s settings make it.
MixedRun run_with(const CompareOptions& o, const Fix& c);

/// Runs the mixed run again as a trial's settings make it and returns what it measured;
/// `next_overflow` (when given) receives the module where its forward pass still
/// overflows, if any. From scratch: the same initial weights, seed and data order; from
/// a branch: the same checkpoint and window.
using TrialRunner = std::function<RunEvidence(const MixedRun& run, std::string* next_overflow)>;

/// Where the forward pass of `learn` first overflows on the probe batch ("" when nowhere).
std::string first_overflow_island(Learner& learn);

/// Hands the caller what is known so far: the verdict and the trials that ended.
void report_progress(const Diagnosis& d, const CompareOptions& o);

/// Runs the verdict's trials, cheapest first, until one is proven that no waiting fix
/// could beat or the budget ends; then settles the diagnosis (failed fixes withdrawn, the
/// proven fix chosen). A head start the verdict kept is its first trial.
void try_fixes(Diagnosis& d, const TrialRunner& runner, const CompareOptions& o, HeadStartTrial* head = nullptr);

} // namespace mixtrain::diagnose::detail
