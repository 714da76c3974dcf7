// What both branches of a run share (branch_point.h): the checkpoint read once, the --at
// lookup, the run-record checks, and how a restored run goes on in another precision.
#include "branch_point.h"

#include "run/run_record.h"
#include "util/comma_list.h"
#include "util/read_file.h"
#include "util/short_number.h"

#include "mixtrain/callbacks/gradient_clip.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/diagnose/compare.h"
#include "mixtrain/util/option_error.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>

namespace mixtrain::run {

using mixtrain::detail::short_number;

namespace {

/// Carries a state entry of the run's checkpoints that the doctor's Learner has no use
/// for (the run record, a tracker's best value), so that they load as they were written.
class StateSink : public Callback {
 public:
  explicit StateSink(std::string key) : key_(std::move(key)) {}
  std::string name() const override { return "StateSink"; }
  std::string state_key() const override { return key_; }

 private:
  std::string key_;
};

} // namespace

int64_t step_of(const std::string& path) {
  static const std::regex pattern(R"(checkpoint-(\d{1,18})\.pt)");
  std::smatch m;
  const std::string file = std::filesystem::path(path).filename().string();
  return std::regex_match(file, m, pattern) ? std::stoll(m[1]) : -1;
}

std::string checkpoint_at(const std::string& from, const std::vector<std::string>& checkpoints, int64_t at) {
  for (const auto& c : checkpoints)
    if (step_of(c) == at) return c;
  std::string steps;
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) steps += (steps.empty() ? "" : ", ") + std::to_string(step_of(*it));
  throw OptionError("at", from + " has no checkpoint at step " + std::to_string(at) + " (it has steps " + steps + ")");
}

BranchPoint read_branch_point(const std::string& checkpoint) {
  BranchPoint p;
  p.path = checkpoint;
  p.bytes = detail::read_whole_file(checkpoint, "checkpoint ");
  torch::serialize::InputArchive ar;
  Learner::open_checkpoint(p.bytes.data(), p.bytes.size(), checkpoint, ar);
  c10::IValue keys, step;
  TORCH_CHECK(ar.try_read("mixtrain.callbacks", keys) && keys.isString(), "Checkpoint ", checkpoint,
              " has no callback list (damaged, or not a mixtrain checkpoint)");
  TORCH_CHECK(ar.try_read("learner.train_iter", step) && step.isTensor() && step.toTensor().numel() == 1, "Checkpoint ",
              checkpoint, " records no training step (damaged, or not a mixtrain checkpoint)");
  for (auto& key : mixtrain::detail::comma_list(keys.toStringRef()))  // the Learner writes them comma-joined
    if (!key.empty()) p.callback_keys.push_back(std::move(key));
  p.step = step.toTensor().item<int64_t>();
  // A renamed file would make every step the report names wrong (its window, its --at).
  const std::string name = std::filesystem::path(checkpoint).filename().string();
  const std::string own = "checkpoint-" + std::to_string(p.step) + ".pt";
  TORCH_CHECK(name == own, "Checkpoint ", checkpoint, " holds step ", p.step, ", which its name does not say (renamed or copied "
              "in?): the run writes it as ", own, "; put it back under that name");
  return p;
}

BranchPoint read_chosen_point(const std::string& checkpoint, const std::vector<std::string>& checkpoints, bool chosen) {
  try {
    return read_branch_point(checkpoint);
  } catch (const c10::Error& e) {
    std::string older;
    for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it)
      if (step_of(*it) < step_of(checkpoint)) older += (older.empty() ? "" : ", ") + std::to_string(step_of(*it));
    if (!chosen || older.empty()) throw;
    const std::string what = e.msg();
    throw OptionError("at", what.substr(0, what.find('\n')) + "; the older checkpoints (steps " + older +
                                ") may be whole: pick one with " + Phrase::name("at"));
  }
}

void load_branch_point(Learner& learn, const BranchPoint& point) {
  std::vector<std::string> here;
  for (const auto& cb : learn.cbs())
    if (!cb->state_key().empty()) here.push_back(cb->state_key());
  std::vector<CallbackPtr> sinks;
  for (const auto& key : point.callback_keys)
    if (std::find(here.begin(), here.end(), key) == here.end()) sinks.push_back(std::make_shared<StateSink>(key));
  for (const auto& s : sinks) learn.add_cb(s);
  learn.load_from_memory(point.bytes.data(), point.bytes.size(), point.path);
  for (const auto& s : sinks) learn.remove_cb(s);
}

std::map<std::string, std::string> check_recorded_run(const RunConfig& as_written, const std::string& checkpoint,
                                                      const std::string& bytes, const std::string& cannot) {
  const std::optional<Recorded> recorded = recorded_run(bytes, checkpoint);
  if (!recorded) return {};
  const SameRunWords words{cannot, checkpoint + " was", Phrase::name("from_run") + " continues that run", ""};
  check_same_run(recorded->config, as_written, words);
  std::map<std::string, std::string> inputs = input_fingerprints(as_written);
  check_same_inputs(recorded->inputs, inputs, as_written, words);
  return inputs;
}

double working_scale(const Recorder& rec, double current, std::string* said) {
  const auto& steps = rec.steps();
  size_t streak = 0;
  while (streak < steps.size() && steps[steps.size() - 1 - streak].skipped) ++streak;
  if (streak < static_cast<size_t>(diagnose::kMinCompareSteps)) return current;
  const double before = steps[steps.size() - streak].scale;
  if (!std::isfinite(before) || before <= current) return current;
  if (said)
    *said = "the run's loss scale had collapsed to " + short_number(current) + " over its last " + std::to_string(streak) +
            " skipped steps: going on at " + short_number(before) + ", the scale before them";
  return before;
}

PrecisionOptions with_run_scale(Learner& learn, Precision precision, PrecisionOptions options,
                                const PrecisionOptions& run_options, std::string* said) {
  const auto pc = learn.precision_cb();
  if (!mode_of(precision).grad_scaler || !pc || !pc->loss_scaled() ||
      options.scaler().init_scale() != run_options.scaler().init_scale())
    return options;
  amp::GradScalerOptions scaler = options.scaler();
  scaler.init_scale(working_scale(learn.recorder(), pc->loss_scale(), said));
  options.scaler(scaler);
  return options;
}

void convert_precision(Learner& learn, Precision precision, PrecisionOptions options, double clip,
                       const PrecisionOptions& run_options) {
  options = with_run_scale(learn, precision, std::move(options), run_options);
  learn.to_fp32();
  if (precision != Precision::kFp32) learn.set_precision(precision, options);
  if (clip > 0) learn.add_cb(std::make_shared<callbacks::GradientClip>(clip));
}

std::string as_one_process(RunConfig& c, const std::string& done) {
  if (c.ranks <= 1) return "";
  const int ranks = c.ranks;
  const int64_t per_rank = c.bs;
  c.bs = per_rank * ranks;
  c.ranks = 1;
  return "it was trained by " + std::to_string(ranks) + " data-parallel ranks of batch size " +
         std::to_string(per_rank) + ": " + done + " in one process with their global batch of " + std::to_string(c.bs) +
         " (the same samples each step; the gradient is summed in another order, and BatchNorm sees the global batch " +
         "where each rank saw its own)";
}

bool weights_finite(Learner& learn) {
  for (const auto& t : learn.model().state_tensors())
    if (t.is_floating_point() && !torch::isfinite(t).all().item<bool>()) return false;
  return true;
}

} // namespace mixtrain::run
