#include "mixtrain/run/branch.h"

#include "mixtrain/optim/optimizers.h"

#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/callbacks/checkpointer.h"
#include "mixtrain/callbacks/gradient_clip.h"
#include "mixtrain/core/learner.h"
#include "mixtrain/core/precision_callback.h"
#include "mixtrain/diagnose/compare.h"
#include "mixtrain/run/learner_builder.h"
#include "mixtrain/run/model_registry.h"
#include "mixtrain/run/run_folder.h"
#include "mixtrain/util/atomic_file.h"
#include "mixtrain/util/option_error.h"
#include "mixtrain/util/threads.h"
#include "mixtrain/compat.h"
#include "mixtrain/data/data.h"
#include "mixtrain/parallel/distributed.h"

#include "run/run_record.h"
#include "util/read_file.h"
#include "util/short_number.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>

namespace mixtrain::run {

namespace {

using mixtrain::detail::short_number;

/// The training step a checkpoint file holds ("checkpoint-120.pt": 120).
int64_t step_of(const std::string& path) {
  static const std::regex pattern(R"(checkpoint-(\d{1,18})\.pt)");
  std::smatch m;
  const std::string file = std::filesystem::path(path).filename().string();
  return std::regex_match(file, m, pattern) ? std::stoll(m[1]) : -1;
}

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

std::vector<std::string> split_keys(const std::string& joined) {
  std::vector<std::string> out;
  std::stringstream in(joined);
  for (std::string k; std::getline(in, k, ',');)
    if (!k.empty()) out.push_back(k);
  return out;
}

/// A checkpoint read once: every Learner built from it loads these bytes, so a run that is
/// still training (and deletes its older checkpoints, --keep) cannot take the file away
/// between two arms. The step is the checkpoint's own record, never its file name.
struct BranchPoint {
  std::string path;
  std::string bytes;
  int64_t step = -1;
  std::vector<std::string> callback_keys;  // the stateful callbacks it holds state for
};

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
  p.callback_keys = split_keys(keys.toStringRef());
  p.step = step.toTensor().item<int64_t>();
  // A renamed file would make every step the report names wrong (its window, its --at).
  const std::string name = std::filesystem::path(checkpoint).filename().string();
  const std::string own = "checkpoint-" + std::to_string(p.step) + ".pt";
  TORCH_CHECK(name == own, "Checkpoint ", checkpoint, " holds step ", p.step, ", which its name does not say (renamed or copied "
              "in?): the run writes it as ", own, "; put it back under that name");
  return p;
}

/// read_branch_point of a checkpoint the branch chose itself (no --at): a damaged one
/// names the older checkpoints that may be whole, as a resume does.
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

/// Loads a branch point into `learn` as a resume does, carrying the state of callbacks the
/// Learner does not have (the run record, trackers) in sinks that go again afterwards.
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

/// The run folder's args.json, and the files it names, are what `checkpoint` recorded it was
/// trained with and on (as a resume checks): an edited lr, bs, seed, ranks, data or model,
/// a data file replaced in place, or a checkpoint copied in from another run would make the
/// branch another run, silently. Refused by name. A checkpoint of an older version records
/// nothing to check.
/// Returns the input files' fingerprints it checked (empty when the checkpoint records none).
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

/// The loss scale a branch goes on at: the run's, unless its last kMinCompareSteps steps or
/// more were all skipped (a scale that collapsed, backed off at every step, as before a NaN
/// stop; a skip or two is a scale finding its level): then the scale those skipped steps
/// started from, the last one that worked. `said` gets a sentence when it is not the run's own.
double working_scale(const Recorder& rec, double current, std::string* said = nullptr) {
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

/// A trial's or a new run's precision on a Learner restored in the run's own: to fp32,
/// then the new mode. A scaler whose settings did not change goes on at the run's scale
/// (the one before a collapse: working_scale).
void convert_precision(Learner& learn, Precision precision, PrecisionOptions options, double clip,
                       const PrecisionOptions& run_options) {
  const auto pc = learn.precision_cb();
  if (precision == Precision::kFp16 && pc && pc->loss_scaled() &&
      options.scaler().init_scale() == run_options.scaler().init_scale()) {
    amp::GradScalerOptions scaler = options.scaler();
    scaler.init_scale(working_scale(learn.recorder(), pc->loss_scale()));
    options.scaler(scaler);
  }
  learn.to_fp32();
  if (precision != Precision::kFp32) learn.set_precision(precision, options);
  if (clip > 0) learn.add_cb(std::make_shared<callbacks::GradientClip>(clip));
}

/// Whether the front end was given `o`: named in RunArgs::given, or set to other than its default.
bool was_given(const Option& o, const RunArgs& a, const RunArgs& defaults) {
  return std::find(a.given.begin(), a.given.end(), o.key) != a.given.end() || o.get(a) != o.get(defaults);
}

/// steps.csv as text: its header and rows, the values as the run wrote them.
struct StepsCsv {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  int column(const std::string& name) const {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? -1 : static_cast<int>(it - header.begin());
  }
  std::string at(size_t row, const std::string& name) const {
    const int c = column(name);
    return c < 0 || row >= rows.size() || static_cast<size_t>(c) >= rows[row].size() ? "" : rows[row][static_cast<size_t>(c)];
  }
};

std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::stringstream in(line);
  while (std::getline(in, field, ',')) out.push_back(field);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

StepsCsv read_steps_csv(const std::string& path) {
  StepsCsv csv;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return csv;
  std::istringstream f(detail::read_whole_file(path, "", detail::kMaxRunFileBytes));  // bounded; no FIFO, no device
  std::string line;
  if (!std::getline(f, line)) return csv;
  csv.header = csv_fields(line);
  while (std::getline(f, line))
    if (!line.empty()) csv.rows.push_back(csv_fields(line));
  return csv;
}

/// A value as steps.csv writes it (ostream, 9 significant digits: float32's all).
std::string as_csv(double v, bool blank_when_nan) {
  if (blank_when_nan && std::isnan(v)) return "";
  std::ostringstream out;
  out.precision(9);
  out << v;
  return out.str();
}

/// What the run recorded before anything is replayed: the seed guide's "check the
/// loss scale history" per epoch, its lost updates and its NaN stop.
std::vector<std::string> run_record(const RunFolder& folder, const StepsCsv& csv) {
  std::vector<std::string> out;
  if (csv.rows.empty()) {
    out.push_back("no steps.csv: the run recorded no steps");
  } else {
    std::map<int64_t, std::vector<size_t>> by_epoch;
    for (size_t i = 0; i < csv.rows.size(); ++i) {
      try {
        by_epoch[std::stoll(csv.at(i, "epoch"))].push_back(i);
      } catch (const std::exception&) {
      }
    }
    for (const auto& [epoch, rows] : by_epoch) {
      int64_t skipped = 0;
      double lo = INFINITY;
      for (size_t i : rows) {
        skipped += csv.at(i, "skipped") == "1";
        const std::string s = csv.at(i, "scale");
        if (s.empty()) continue;
        const double v = std::strtod(s.c_str(), nullptr);
        lo = std::min(lo, v);
      }
      std::string line = "epoch " + std::to_string(epoch) + ": " + std::to_string(rows.size()) + " steps, loss " +
                         csv.at(rows.front(), "loss") + " -> " + csv.at(rows.back(), "loss");
      if (std::isfinite(lo)) {
        // The epoch's first and last recorded scales: a branch into bf16 records none after the parent's.
        std::string first, last;
        for (size_t i : rows)
          if (const std::string v = csv.at(i, "scale"); !v.empty()) (first.empty() ? first : last) = v;
        if (last.empty()) last = first;
        line += ", " + std::to_string(skipped) + " skipped, loss scale " + first + " -> " + last;
        if (lo < std::min(std::strtod(first.c_str(), nullptr), std::strtod(last.c_str(), nullptr)))
          line += " (lowest " + short_number(lo) + ")";
      }
      out.push_back(line);
    }
  }
  std::error_code ec;
  if (!std::filesystem::exists(folder.file("summary.json"), ec)) return out;
  const std::string summary = detail::read_whole_file(folder.file("summary.json"), "", detail::kMaxRunFileBytes);
  try {
    const nlohmann::json j = nlohmann::json::parse(summary);
    if (j.contains("lost_updates") && j["lost_updates"].is_object()) {
      const auto& l = j["lost_updates"];
      std::string line = "lost updates: " + short_number(100 * l.value("fraction", 0.0), 3) + "% of element updates rounded away (" +
                         l.value("weight_update", std::string("?")) + " rounding)";
      if (l.contains("per_epoch") && l["per_epoch"].is_array() && l["per_epoch"].size() > 1) {
        line += "; per epoch:";
        for (const auto& v : l["per_epoch"]) line += " " + short_number(100 * v.get<double>(), 3) + "%";
      }
      out.push_back(line);
    }
    if (j.contains("stopped") && j["stopped"].is_string()) out.push_back("the NaN stop: " + j["stopped"].get<std::string>());
  } catch (const std::exception&) {
    out.push_back("summary.json is damaged: its lost updates and stop are not shown");
  }
  return out;
}

/// The replayed mixed arm against the steps the run recorded: loss, scale and skip.
void check_replay(diagnose::Replay& r, const diagnose::RunEvidence& mixed, const StepsCsv& csv) {
  const size_t first = static_cast<size_t>(mixed.first_step);
  if (csv.rows.size() <= first) {
    r.not_compared = csv.rows.empty() ? "the run has no steps.csv"
                                      : "the run recorded none of the window's steps (it recorded " +
                                            std::to_string(csv.rows.size()) + ")";
    return;
  }
  // A replay "matches" only where a loss was compared: a steps.csv without the column proves nothing.
  if (csv.column("loss") < 0 || mixed.losses.empty()) {
    r.not_compared = csv.column("loss") < 0 ? "the run's steps.csv has no loss column" : "the replay recorded no step";
    return;
  }
  for (size_t k = 0; k < mixed.losses.size() && first + k < csv.rows.size(); ++k) {
    const size_t row = first + k;
    const std::pair<std::string, std::string> compared[] = {
        {"loss", as_csv(mixed.losses[k], false)},
        {"scale", as_csv(k < mixed.scales.size() ? mixed.scales[k] : NAN, true)},
        {"skipped", as_csv(k < mixed.skipped.size() && mixed.skipped[k] ? 1 : 0, false)}};
    for (const auto& [column, replayed] : compared) {
      if (csv.column(column) < 0 || csv.at(row, column) == replayed) continue;
      r.matches_run = false;
      r.first_difference = static_cast<int64_t>(row);
      r.difference = column + " " + replayed + " replayed, " + csv.at(row, column) + " in the run's steps.csv";
      return;
    }
  }
  r.matches_run = true;
}

/// A data-parallel run's flags for one process: its global batch (ranks x bs) as one
/// batch. The loader's shards are slices of one seeded permutation's global batches
/// (DataLoaderOptions::num_shards), so the one process takes each step's samples of all
/// ranks together, and the mean loss's gradient is the mean of the ranks' averaged ones.
/// Returns what that means, in words (`done`: "replayed", ...); empty for a one-process run.
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

/// Whether every weight and buffer of the Learner is finite.
bool weights_finite(Learner& learn) {
  for (const auto& t : learn.model().state_tensors())
    if (t.is_floating_point() && !torch::isfinite(t).all().item<bool>()) return false;
  return true;
}

} // namespace

/// A branch doctor's on_progress: each diagnosis kept with its replay, whose `seconds` are
/// from `start` (restoring, both arms) to the verdict, also set in `arms_seconds`.
std::function<void(const diagnose::Diagnosis&)> keep_with_replay(DoctorProgress& progress, const diagnose::Replay& replay,
                                                                std::chrono::steady_clock::time_point start,
                                                                double& arms_seconds) {
  return [&progress, &replay, start, &arms_seconds](const diagnose::Diagnosis& now) {
    if (arms_seconds < 0) arms_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    diagnose::Diagnosis known = now;
    known.replay = replay;
    known.replay->seconds = arms_seconds;
    progress.keep(known);
  };
}

/// Where a run that did not finish went wrong, by its steps.csv: its first NaN/inf loss,
/// else the first of its last steps when it skipped at least kMinCompareSteps of them in a
/// row (a scale backing off at every step). step -1: neither.
struct Onset {
  int64_t step = -1;
  std::string what;
};

Onset onset_of_failure(const StepsCsv& csv) {
  Onset o;
  if (csv.column("loss") < 0) return o;
  for (size_t i = 0; i < csv.rows.size(); ++i) {
    const std::string v = csv.at(i, "loss");
    if (v.empty()) continue;
    if (!std::isfinite(std::strtod(v.c_str(), nullptr))) {
      o.step = static_cast<int64_t>(i);
      o.what = "its first NaN/inf loss";
      return o;
    }
  }
  size_t streak = 0;
  while (streak < csv.rows.size() && csv.at(csv.rows.size() - 1 - streak, "skipped") == "1") ++streak;
  if (streak >= static_cast<size_t>(diagnose::kMinCompareSteps)) {
    o.step = static_cast<int64_t>(csv.rows.size() - streak);
    o.what = "the first of the " + std::to_string(streak) + " skipped steps it ended with";
  }
  return o;
}

/// The newest checkpoint before `onset` with finite weights, and (unless given) a window
/// that reaches past the onset by half the way there, at least kMinCompareSteps: what
/// the doctor sees there is how the run went wrong, not a state it had already lost
/// (a scale collapsed by its back-offs, which every trial would inherit). False when no
/// checkpoint comes before it.
template <typename LeftAfter, typename Restored>
bool place_before(const Onset& onset, const std::vector<std::string>& checkpoints, const LeftAfter& left_after,
                  const Restored& restored, std::string& checkpoint, BranchPoint& point, int64_t& window,
                  std::vector<std::string>& notes) {
  for (const auto& c : checkpoints) {  // newest first
    const int64_t at = step_of(c);
    if (at >= onset.step || left_after(c) <= onset.step - at) continue;
    BranchPoint candidate = read_branch_point(c);
    if (!weights_finite(*restored(candidate))) continue;
    const int64_t to_onset = onset.step - at;
    if (window < 0)
      window = std::min(left_after(c), std::max(kDefaultWindow, to_onset + std::max<int64_t>(diagnose::kMinCompareSteps, to_onset / 2)));
    checkpoint = c;
    point = std::move(candidate);
    notes.push_back("the run did not finish; it went wrong at step " + std::to_string(onset.step) + " (" + onset.what +
                    "): branched from " + c + ", before it, for " + std::to_string(window) + " steps, to step " +
                    std::to_string(at + window) +
                    (at + window > onset.step ? " (" + std::to_string(at + window - onset.step) + " past it)" : std::string()));
    return true;
  }
  return false;
}

diagnose::Diagnosis doctor_from(RunArgs a, const OptionWords& words, const StopFlags& stop) {
  const RunTurn turn;
  const std::string from = a.from_run;
  const RunFolder run(from);
  std::error_code ec;
  if (!std::filesystem::is_directory(from, ec))
    throw OptionError("from_run", Phrase::name("from_run") + " " + from + " is not a run folder (no such directory, or not a directory)");
  // The run's own flags: any other given is refused, rather than silently ignored.
  const RunArgs defaults = defaults_for(Command::kDoctor);
  for (const Option& o : options()) {
    if (!o.stored || o.key == "threads" || !was_given(o, a, defaults)) continue;
    throw OptionError(o.key, Phrase::name("from_run") + " replays the run with its own flags (" + from + "/args.json); drop " +
                                 Phrase::name(o.key));
  }
  RunArgs b;  // the run's arguments
  try {
    b.config = run.read_config();
  } catch (const c10::Error& e) {
    throw OptionError("from_run", "cannot branch from " + from + ": " + e.msg());
  }
  const RunConfig as_written = b.config;  // args.json, before one process takes the ranks' batch
  if (a.config.threads != defaults.config.threads) b.config.threads = a.config.threads;
  b.model_source = a.model_source;
  b.data_source = a.data_source;
  const RunConfig& r = b.config;
  // A run trained from Python holds neither its model nor its data: the caller hands them over again.
  std::error_code no_file;
  const bool model_known = b.model_source || find_builtin_model(r.model) || std::filesystem::is_regular_file(r.model, no_file);
  // A file the CLI trained on is recorded by its path; a model handed over in memory by its name.
  if (!model_known && r.model.find('/') != std::string::npos)
    throw OptionError("from_run", "cannot branch from " + from + ": its model file " + r.model +
                                      " is no longer there (moved or deleted): put it back");
  if (!model_known || (!b.data_source && r.data.empty() && !find_builtin_model(r.model)))
    throw OptionError("from_run", "cannot branch from " + from + ": it trained on a model and data handed over in memory (" +
                                      r.model + "), which the folder does not hold; pass them again with it");
  if (r.precision == Precision::kFp32)
    throw OptionError("from_run", "cannot branch from " + from + ": it trained in fp32, so there is no mixed precision to diagnose");
  const int ranks = r.ranks;
  const std::string one_process = as_one_process(b.config, "replayed");
  if (!r.lr.one_for_all())
    throw OptionError("from_run", "cannot branch from " + from + ": its " + Phrase::name("lr") + " " + r.lr.str() +
                                      " is one per parameter group; the doctor replays one");
  if (a.at < -1) throw OptionError("at", "invalid " + Phrase::name("at") + " " + std::to_string(a.at) + ": a training step is >= 0");
  if (a.window != -1 && a.window < diagnose::kMinCompareSteps)
    throw OptionError("window", "a " + Phrase::name("window") + " of " + std::to_string(a.window) +
                                    " step(s) is too short to judge; the comparison needs at least " +
                                    std::to_string(diagnose::kMinCompareSteps));
  const std::vector<std::string> checkpoints = callbacks::Checkpointer::newest_first(from);
  if (checkpoints.empty())
    throw OptionError("from_run", "cannot branch from " + from + ": it holds no checkpoint (train with " +
                                      Phrase::name("save_every") + " or " + Phrase::name("save_every_steps") + ")");
  if (a.out.empty()) a.out = RunFolder::default_path("doctor-");
  a.out = RunFolder::resolve(a.out);
  if (std::filesystem::weakly_canonical(a.out, ec) == std::filesystem::weakly_canonical(from, ec))
    throw OptionError("out", "the doctor writes into its own " + Phrase::name("out") + ", not into the run folder " + from);
  RunFolder(a.out).refuse_run("the doctor");

  const RunStart prepared = start_run(b, /*world_size=*/1);
  const int threads = prepared.threads;
  const data::DatasetSplit& split = prepared.split;
  const PrecisionOptions own_options = PrecisionOptions(r.precision_options).rounding_seed(r.seed);

  // A Learner as the run built it, with the checkpoint loaded as a resume loads it.
  const auto restored = [&](const BranchPoint& point) {
    std::unique_ptr<Learner> learn = build_learner(b, split, /*progress=*/false);
    learn->set_precision(r.precision, own_options);
    load_branch_point(*learn, point);
    learn->recorder().start_branch();  // each arm's smoothed loss starts at the branch
    return learn;
  };
  BranchPoint point;  // the chosen checkpoint, read once

  // The run's schedule: how many steps, and where each checkpoint stands in it.
  int64_t total_steps = 0;
  {
    std::unique_ptr<Learner> probe = build_learner(b, split, /*progress=*/false);
    total_steps = r.epochs * probe->dls().train.num_batches();
  }
  const bool stopped = !run.finished();
  const StepsCsv csv = read_steps_csv(run.file("steps.csv"));
  std::string checkpoint;
  std::vector<std::string> notes;
  int64_t window = a.window;
  const auto left_after = [&](const std::string& c) { return total_steps - step_of(c); };
  if (a.at >= 0) {
    for (const auto& c : checkpoints)
      if (step_of(c) == a.at) checkpoint = c;
    if (checkpoint.empty()) {
      std::string steps;
      for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) steps += (steps.empty() ? "" : ", ") + std::to_string(step_of(*it));
      throw OptionError("at", from + " has no checkpoint at step " + std::to_string(a.at) + " (it has steps " + steps + ")");
    }
  } else if (const Onset onset = onset_of_failure(csv); stopped && onset.step > 0 &&
                                                        place_before(onset, checkpoints, left_after, restored, checkpoint,
                                                                     point, window, notes)) {
    // Branched before the run went wrong, with a window that reaches past it.
  } else if (stopped) {
    // Branched from the state it stopped in, unless its weights are no longer finite.
    checkpoint = checkpoints.front();
    for (size_t i = 0; i < checkpoints.size(); ++i) {
      BranchPoint candidate = read_chosen_point(checkpoints[i], checkpoints, /*chosen=*/true);
      if (weights_finite(*restored(candidate))) {
        checkpoint = checkpoints[i];
        point = std::move(candidate);
        break;
      }
      if (i + 1 == checkpoints.size())
        throw OptionError("from_run", "cannot branch from " + from + ": the weights of every checkpoint are NaN/inf");
      notes.push_back("the weights of " + checkpoints[i] + " are NaN/inf: branched from the checkpoint before it");
    }
    notes.push_back(std::string("the run did not finish: branched from ") +
                    (checkpoint == checkpoints.front() ? "the state it stopped in" : "the last finite state before it"));
    if (r.precision == Precision::kFp16) {
      const std::unique_ptr<Learner> at_stop = restored(point);
      std::string said;
      if (const auto pc = at_stop->precision_cb(); pc && pc->loss_scaled())
        working_scale(at_stop->recorder(), pc->loss_scale(), &said);
      if (!said.empty()) notes.push_back(said + " (the trials; the run's own replay keeps its scale)");
    }
  } else {
    const int64_t wanted = window >= 0 ? window : kDefaultWindow;
    for (const auto& c : checkpoints)
      if (left_after(c) >= wanted) {
        checkpoint = c;
        break;
      }
    if (checkpoint.empty()) checkpoint = checkpoints.back();  // the earliest: the longest window there is
    if (checkpoint != checkpoints.front())
      notes.push_back("the newest checkpoint the run went on from for " + std::to_string(std::min(wanted, left_after(checkpoint))) +
                      " steps (the newest, " + checkpoints.front() + ", leaves " + std::to_string(left_after(checkpoints.front())) + ")");
  }
  if (point.path != checkpoint) point = read_chosen_point(checkpoint, checkpoints, a.at < 0);
  check_recorded_run(as_written, checkpoint, point.bytes, "cannot branch from " + from);
  const int64_t left = left_after(checkpoint);
  if (window < 0) window = std::min(kDefaultWindow, left);
  if (window > left)
    throw OptionError("window", "a " + Phrase::name("window") + " of " + std::to_string(window) + " steps from step " +
                                    std::to_string(step_of(checkpoint)) + " runs past the end of the run's schedule (" +
                                    std::to_string(total_steps) + " steps): at most " + std::to_string(left));
  if (left <= 0)
    throw OptionError("at", checkpoint + " is at step " + std::to_string(step_of(checkpoint)) + ", the end of the run's schedule (" +
                                std::to_string(total_steps) + " steps): nothing is left to replay; pick an earlier one with " +
                                Phrase::name("at"));
  if (window < diagnose::kMinCompareSteps)
    throw OptionError("window", "the run's schedule has " + std::to_string(left) + " step(s) left after " + checkpoint +
                                    ", too few to judge (at least " + std::to_string(diagnose::kMinCompareSteps) +
                                    "); pick an earlier one with " + Phrase::name("at"));
  // Everything is checked: the doctor's own folder is created now (never the run's).
  const RunFolder folder(a.out);
  folder.prepare();

  diagnose::Replay replay;
  replay.from = from;
  replay.checkpoint = checkpoint;
  replay.step = step_of(checkpoint);
  replay.window = window;
  if (!one_process.empty()) notes.push_back(one_process);
  replay.notes = notes;
  replay.record = run_record(run, csv);
  std::cout << "mixtrain doctor: branching " << from << " (model " << r.model << ", precision " << precision_name(r.precision)
            << ") from " << checkpoint << ": " << window << " steps in fp32 and in " << precision_name(r.precision) << ", "
            << threads << " thread(s)" << std::endl;
  std::cout << "the run's own record:" << std::endl;
  for (const auto& line : replay.record) std::cout << "  " << line << std::endl;

  const auto start = std::chrono::steady_clock::now();
  double arms_seconds = -1;
  std::chrono::steady_clock::time_point fp32_ready;
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const diagnose::BranchFactory at_branch = [&](diagnose::Arm arm, const diagnose::MixedRun& trial) {
    const auto entered = std::chrono::steady_clock::now();
    // The fp32 arm ran from when its Learner was ready until the run's arm is asked for.
    if (arm == diagnose::Arm::kRun && replay.restore_seconds > 0) replay.fp32_arm_seconds = since(fp32_ready);
    if (arm == diagnose::Arm::kFp32) std::cout << "doctor: 1/2 fp32 from the checkpoint" << std::endl;
    if (arm == diagnose::Arm::kRun)
      std::cout << "doctor: 2/2 " << precision_name(r.precision) << " from the checkpoint (the run, continued)" << std::endl;
    std::unique_ptr<Learner> learn = restored(point);
    if (arm == diagnose::Arm::kFp32) {
      learn->to_fp32();
      replay.restore_seconds = since(entered);
      fp32_ready = std::chrono::steady_clock::now();
    } else if (arm == diagnose::Arm::kTrial) {
      convert_precision(*learn, trial.precision, trial.options, trial.clip, own_options);
    }
    add_stop_callbacks(*learn, stop, /*keeps_checkpoints=*/false);
    return learn;
  };
  DoctorProgress progress(folder, words, stop, a.report_files);
  const auto keep = keep_with_replay(progress, replay, start, arms_seconds);
  diagnose::Diagnosis d = progress.run([&] {
    return diagnose::compare_branch(at_branch,
                                                   diagnose::CompareOptions()
                                                       .epochs(r.epochs)
                                                       .lr(r.lr.last())
                                                       .precision(r.precision)
                                                       .precision_options(own_options)
                                                       .max_trials(a.no_trials ? 0 : a.max_trials)
                                                       .apply_setting(apply_setting)
                                                       .seed(r.seed)
                                                       .on_progress(keep),
                                                   window);
  });
  replay.seconds = arms_seconds;
  if (ranks > 1)
    replay.not_compared = "the run was trained by " + std::to_string(ranks) +
                          " ranks and replayed in one process, which adds their gradients in another order: not bitwise the run";
  else if (d.evidence.mixed)
    check_replay(replay, *d.evidence.mixed, csv);
  d.replay = replay;
  std::string next;
  if (d.proven_fix)
    next = "continue the run with it: " + train_command(ranks) + " --from " + from + " --at " + std::to_string(replay.step) + " --out NEW_DIR " +
           d.trials[*d.proven_fix].settings_in(flag_words()) + "\n";
  write_doctor_outputs(d, folder, words, a, next);
  return d;
}

namespace {
/// A row of the precision mode's settings: the mode, or an option of it.
bool sets_the_precision(const Option& o) {
  return o.key == "precision" || o.key == "weight_update" || o.key == "dynamic" || !o.modes.empty();
}
/// What train --from may change: how the run computes, not what it trains on or how long.
bool changes_only_how_it_computes(const Option& o) {
  static const std::set<std::string> kept{"threads", "thread_policy", "clip", "save_every", "save_every_steps", "keep",
                                          "max_bad_steps"};
  return kept.count(o.key) > 0 || sets_the_precision(o);
}
} // namespace

BranchStart start_from_run(RunArgs& a) {
  BranchStart start;
  start.from = a.from_run;
  if (!a.resume.empty())
    throw OptionError("from_run", Phrase::name("from_run") + " starts a new run from another run's checkpoint, " +
                                      Phrase::name("resume") + " continues a run in its own folder: pass one of them");
  std::error_code ec;
  if (!std::filesystem::is_directory(start.from, ec))
    throw OptionError("from_run", Phrase::name("from_run") + " " + start.from + " is not a run folder (no such directory, or not a directory)");
  try {
    start.trained = RunFolder(start.from).read_config();
  } catch (const c10::Error& e) {
    throw OptionError("from_run", "cannot start from " + start.from + ": " + e.msg());
  }
  const RunConfig as_written = start.trained;  // args.json, before one process takes the ranks' batch
  // The same ranks go on with the same batch per rank; one process takes their global batch.
  const int world = distributed::env_from_environment().world_size;
  const int ranks = start.trained.ranks;
  if (world != ranks && world != 1)
    throw OptionError("from_run", "cannot start " + std::to_string(world) + " ranks from " + start.from + ": it was trained by " +
                                      std::to_string(ranks) + (ranks > 1 ? " ranks" : " process") +
                                      ", and another count would change its global batch; continue it with " +
                                      train_command(ranks) + " " + Phrase::name("from_run") + " " + start.from);
  if (world == 1) start.one_process = as_one_process(start.trained, "continued");
  // The new run: the run's own flags, with the given ones that change only how it computes.
  const RunArgs defaults = defaults_for(Command::kTrain);
  RunArgs merged = a;
  merged.config = start.trained;
  for (const Option& o : options()) {
    if (!o.stored || o.key == "ranks" || !was_given(o, a, defaults)) continue;
    const std::string given = o.get(a);
    if (!changes_only_how_it_computes(o))
      throw OptionError(o.key, Phrase::name("from_run") + " continues " + start.from + "'s schedule on its model and data: " +
                                   Phrase::name(o.key) + " would make it another run (drop it, or start a new run without " +
                                   Phrase::name("from_run") + ")");
    o.set(merged, given);
  }
  a.config = merged.config;
  a.config.ranks = 1;
  if (a.out.empty()) a.out = RunFolder::default_path("");
  a.out = RunFolder::resolve(a.out);
  if (std::filesystem::weakly_canonical(a.out, ec) == std::filesystem::weakly_canonical(start.from, ec))
    throw OptionError("out", Phrase::name("from_run") + " starts a new run: give it its own " + Phrase::name("out") +
                                 ", not " + start.from);
  const std::vector<std::string> checkpoints = callbacks::Checkpointer::newest_first(start.from);
  if (checkpoints.empty())
    throw OptionError("from_run", "cannot start from " + start.from + ": it holds no checkpoint");
  if (a.at < -1) throw OptionError("at", "invalid " + Phrase::name("at") + " " + std::to_string(a.at) + ": a training step is >= 0");
  if (a.at >= 0) {
    for (const auto& c : checkpoints)
      if (step_of(c) == a.at) start.checkpoint = c;
    if (start.checkpoint.empty()) {
      std::string steps;
      for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) steps += (steps.empty() ? "" : ", ") + std::to_string(step_of(*it));
      throw OptionError("at", start.from + " has no checkpoint at step " + std::to_string(a.at) + " (it has steps " + steps + ")");
    }
  } else {
    start.checkpoint = checkpoints.front();
    if (RunFolder(start.from).finished())
      throw OptionError("at", start.from + " finished its schedule: its newest checkpoint leaves nothing to train; pick an "
                                           "earlier one with " + Phrase::name("at"));
  }
  const BranchPoint point = read_chosen_point(start.checkpoint, checkpoints, a.at < 0);
  start.step = point.step;
  start.inputs = check_recorded_run(as_written, start.checkpoint, point.bytes, "cannot start from " + start.from);
  return start;
}

void restore_branch(Learner& learn, const BranchStart& start, const RunConfig& now) {
  const RunConfig& was = start.trained;
  const PrecisionOptions run_options = PrecisionOptions(was.precision_options).rounding_seed(was.seed);
  learn.set_precision(was.precision, run_options);
  load_branch_point(learn, read_branch_point(start.checkpoint));
  const int64_t left = now.epochs * learn.dls().train.num_batches() - start.step;
  if (left <= 0)
    throw OptionError("at", start.checkpoint + " is the end of " + start.from + "'s schedule: nothing is left to train; pick an "
                                               "earlier one with " + Phrase::name("at"));
  // The same precision settings: the run's state goes on untouched (a resume in a new folder).
  RunArgs before, after;
  before.config = was;
  after.config = now;
  bool same = true;
  for (const Option& o : options())
    if (o.stored && sets_the_precision(o) && o.get(before) != o.get(after)) same = false;
  if (same) {
    add_fit_warning(learn, now.precision);
    return;
  }
  // The new mode, with the run layer's own attachments (the end-of-fit warning); a scaler
  // whose settings did not change goes on at the run's scale.
  RunConfig mode = now;
  const auto pc = learn.precision_cb();
  if (now.precision == Precision::kFp16 && pc && pc->loss_scaled() &&
      now.precision_options.scaler().init_scale() == was.precision_options.scaler().init_scale()) {
    amp::GradScalerOptions scaler = mode.precision_options.scaler();
    std::string said;
    scaler.init_scale(working_scale(learn.recorder(), pc->loss_scale(), &said));
    if (!said.empty()) std::cout << "mixtrain train: " << said << std::endl;
    mode.precision_options.scaler(scaler);
  }
  learn.to_fp32();
  set_precision(learn, mode);
  // Another precision is another run from here: its smoothed loss and its counts start
  // here (a parent's NaN would stay in the smoothed loss, its skips in summary.json's).
  learn.recorder().start_branch();
}

namespace {

/// The loop's state of one parameter as libtorch's optimizer keeps it.
std::unique_ptr<torch::optim::OptimizerParamState> loop_param_state(const std::string& optimizer, const std::string& name,
                                                                    const std::map<std::string, at::Tensor>& st,
                                                                    const torch::Tensor& p) {
  const auto tensor = [&](const char* key, bool required) {
    const auto it = st.find(key);
    if (it == st.end() || !it->second.defined()) {
      if (required) throw OptionError("optimizer", Phrase("the optimizer's state of " + name + " has no " + key));
      return torch::Tensor();
    }
    TORCH_CHECK(it->second.sizes() == p.sizes(), "the optimizer's ", key, " of ", name, " has shape ", it->second.sizes(),
                ", the parameter ", p.sizes());
    return it->second.to(p.device(), torch::kFloat).contiguous().clone();  // bf16 state's values, exactly
  };
  const auto step = [&] {
    const auto it = st.find("step");
    if (it == st.end() || !it->second.defined()) throw OptionError("optimizer", Phrase("the optimizer's state of " + name + " has no step"));
    return static_cast<int64_t>(std::llround(it->second.item<double>()));
  };
  if (optimizer == "sgd") {
    auto out = std::make_unique<torch::optim::SGDParamState>();
    out->momentum_buffer(tensor("momentum_buffer", false));
    if (!out->momentum_buffer().defined()) return nullptr;  // SGD without momentum keeps nothing
    return out;
  }
  if (optimizer == "rmsprop") {
    auto out = std::make_unique<torch::optim::RMSpropParamState>();
    out->step(step());
    out->square_avg(tensor("square_avg", true));
    out->momentum_buffer(tensor("momentum_buffer", false));
    out->grad_avg(tensor("grad_avg", false));
    return out;
  }
  if (optimizer == "adagrad") {
    auto out = std::make_unique<torch::optim::AdagradParamState>();
    out->step(step());
    out->sum(tensor("sum", true));
    return out;
  }
  const auto fill = [&](auto& out) {
    out->step(step());
    out->exp_avg(tensor("exp_avg", true));
    out->exp_avg_sq(tensor("exp_avg_sq", true));
    const torch::Tensor max_sq = tensor("max_exp_avg_sq", false);
    if (max_sq.defined()) out->max_exp_avg_sq(max_sq);
  };
  if (optimizer == "adamw") {
    auto out = std::make_unique<torch::optim::AdamWParamState>();
    fill(out);
    return out;
  }
  auto out = std::make_unique<torch::optim::AdamParamState>();
  fill(out);
  return out;
}

/// The model's parameters by name.
std::map<std::string, torch::Tensor> params_by_name(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : module.named_parameters()) out.emplace(p.key(), p.value());
  return out;
}

/// The largest step count among the loop's parameter states: how far the loop had trained.
int64_t loop_step(const LoopState& loop) {
  int64_t step = -1;  // SGD counts none
  for (const auto& [name, st] : loop.state) {
    const auto it = st.find("step");
    if (it != st.end() && it->second.defined()) step = std::max<int64_t>(step, std::llround(it->second.item<double>()));
  }
  return step;
}

/// Puts the loop's optimizer state into `learn`'s optimizer (built by loop_optimizer),
/// before any precision is attached: the modes carry it from there as a resume's.
void load_loop_state(Learner& learn, const LoopState& loop) {
  torch::optim::Optimizer& opt = learn.opt();
  const auto params = params_by_name(learn.model().module());
  auto* rounded = dynamic_cast<mixtrain::optim::RoundedSteps*>(&opt);  // mixtrain.optim's rounding state, if ours
  for (const auto& [name, st] : loop.state) {
    const auto p = params.find(name);
    if (p == params.end()) throw OptionError("optimizer", Phrase("the optimizer holds state for " + name + ", which the model does not have"));
    if (auto state = loop_param_state(loop.optimizer, name, st, p->second)) compat::set_optimizer_state(opt, p->second, std::move(state));
    // mixtrain.optim's Kahan compensation ("kahan_comp", a bf16 tensor): the window carries
    // on with what the loop's rounding had kept back, as a resume would.
    const auto comp = st.find("kahan_comp");
    if (rounded && comp != st.end() && comp->second.defined()) {
      TORCH_CHECK(comp->second.sizes() == p->second.sizes(), "the optimizer's kahan_comp of ", name, " has shape ",
                  comp->second.sizes(), ", the parameter ", p->second.sizes());
      rounded->set_compensation(p->second, comp->second.to(p->second.device(), torch::kBFloat16).contiguous().clone());
    }
  }
  // mixtrain.optim draws each stochastic rounding from (step, parameter index): the
  // window goes on from the loop's count, as the loop's optimizer (or the cure's) would.
  if (const int64_t step = loop_step(loop); rounded && step > 0) rounded->set_steps_taken(step);
}

} // namespace

OptimizerFactory loop_optimizer(const LoopState& loop, const Model& model) {
  const std::shared_ptr<torch::nn::Module> module = model.ptr();
  return [&loop, module](const std::vector<torch::Tensor>&, double) -> std::unique_ptr<torch::optim::Optimizer> {
    const auto params = params_by_name(*module);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (const auto& g : loop.groups) {
      std::vector<torch::Tensor> held;
      for (const auto& name : g.params) {
        const auto p = params.find(name);
        if (p == params.end()) throw OptionError("optimizer", Phrase("the optimizer holds " + name + ", which the model does not have"));
        held.push_back(p->second);
      }
      std::unique_ptr<torch::optim::OptimizerOptions> options;
      if (loop.optimizer == "rmsprop")
        options = std::make_unique<torch::optim::RMSpropOptions>(torch::optim::RMSpropOptions(g.lr)
                                                                     .alpha(g.alpha)
                                                                     .eps(g.eps)
                                                                     .weight_decay(g.weight_decay)
                                                                     .momentum(g.momentum)
                                                                     .centered(g.centered));
      else if (loop.optimizer == "adagrad")
        options = std::make_unique<torch::optim::AdagradOptions>(torch::optim::AdagradOptions(g.lr)
                                                                     .lr_decay(g.lr_decay)
                                                                     .weight_decay(g.weight_decay)
                                                                     .initial_accumulator_value(g.initial_accumulator_value)
                                                                     .eps(g.eps));
      else if (loop.optimizer == "sgd")
        options = std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(g.lr)
                                                                 .momentum(g.momentum)
                                                                 .dampening(g.dampening)
                                                                 .nesterov(g.nesterov)
                                                                 .weight_decay(g.weight_decay));
      else if (loop.optimizer == "adamw")
        options = std::make_unique<torch::optim::AdamWOptions>(
            torch::optim::AdamWOptions(g.lr).betas({g.beta1, g.beta2}).eps(g.eps).weight_decay(g.weight_decay).amsgrad(g.amsgrad));
      else
        options = std::make_unique<torch::optim::AdamOptions>(
            torch::optim::AdamOptions(g.lr).betas({g.beta1, g.beta2}).eps(g.eps).weight_decay(g.weight_decay).amsgrad(g.amsgrad));
      groups.emplace_back(std::move(held), std::move(options));
    }
    const auto& first = loop.groups.front();
    if (loop.optimizer == "sgd") return std::make_unique<mixtrain::optim::SGD>(groups, torch::optim::SGDOptions(first.lr));
    if (loop.optimizer == "rmsprop") return std::make_unique<mixtrain::optim::RMSprop>(groups);
    if (loop.optimizer == "adagrad")
      return std::make_unique<mixtrain::optim::Adagrad>(
          groups, torch::optim::AdagradOptions(first.lr).initial_accumulator_value(first.initial_accumulator_value));
    if (loop.optimizer == "adamw") return std::make_unique<mixtrain::optim::AdamW>(groups);
    return std::make_unique<mixtrain::optim::Adam>(groups);
  };
}

diagnose::Diagnosis doctor_from_loop(RunArgs a, const OptionWords& words, const StopFlags& stop) {
  const RunTurn turn;
  TORCH_CHECK(a.loop && !a.loop->groups.empty(), "doctor_from_loop: no optimizer state (RunArgs::loop)");
  const LoopState& loop = *a.loop;
  validate(a, Command::kDoctor);
  RunConfig& r = a.config;
  check_doctor_compares(r.precision);
  const double lr = loop.groups.front().lr;
  for (const auto& g : loop.groups)
    if (g.lr != lr)
      throw OptionError("optimizer", Phrase("the optimizer's param groups have different learning rates (" + short_number(lr, 3) +
                                         ", " + short_number(g.lr, 3) + "); the doctor replays one"));
  r.lr = lr;
  r.epochs = 1;
  r.wd_bn_bias = true;  // the loop's own groups, as they are
  const RunStart prepared = start_run(a, /*world_size=*/1);
  const int threads = prepared.threads;
  const data::DatasetSplit& split = prepared.split;
  const int64_t window = split.train.size() / r.bs;
  if (window < diagnose::kMinCompareSteps)
    throw OptionError("window", "a window of " + std::to_string(window) + " step(s) is too short to judge; the comparison needs at least " +
                                    std::to_string(diagnose::kMinCompareSteps));
  // The loop's own rounding seed: the arm and the trials round as the loop's optimizer would.
  const PrecisionOptions own_options = PrecisionOptions(r.precision_options).rounding_seed(loop.rounding_seed);
  if (!own_options.keep_fp32().empty()) amp::check_islands(own_options.keep_fp32(), build_model(a).module());
  if (a.out.empty()) a.out = RunFolder::default_path("doctor-");
  a.out = RunFolder::resolve(a.out);
  const RunFolder folder(a.out);
  folder.refuse_run("the doctor");
  folder.prepare();

  diagnose::Replay replay;
  replay.checkpoint = "the training loop's state";
  replay.step = loop_step(loop);
  replay.window = window;
  replay.not_compared = "a training loop records no steps to check it against";
  std::cout << "mixtrain doctor: branching the training loop (" << loop.optimizer
            << (replay.step >= 0 ? ", optimizer step " + std::to_string(replay.step) : std::string()) << ", lr "
            << short_number(lr, 3) << "): its next " << window << " batches in fp32 and in " << precision_name(r.precision)
            << ", " << threads << " thread(s)" << std::endl;
  const auto start = std::chrono::steady_clock::now();
  double arms_seconds = -1;
  const diagnose::BranchFactory at_loop = [&](diagnose::Arm arm, const diagnose::MixedRun& trial) {
    if (arm == diagnose::Arm::kFp32) std::cout << "doctor: 1/2 fp32 from the loop's state" << std::endl;
    if (arm == diagnose::Arm::kRun) std::cout << "doctor: 2/2 " << precision_name(r.precision) << " from the loop's state" << std::endl;
    std::unique_ptr<Learner> learn = build_learner(a, split, /*progress=*/false);
    // The loop's batches in the loop's order.
    learn->dls().train = data::DataLoader(split.train, data::DataLoaderOptions().batch_size(r.bs));
    load_loop_state(*learn, loop);
    if (arm == diagnose::Arm::kRun) {
      learn->set_precision(r.precision, own_options);
    } else if (arm == diagnose::Arm::kTrial) {
      learn->set_precision(trial.precision, trial.options);
      if (trial.clip > 0) learn->add_cb(std::make_shared<callbacks::GradientClip>(trial.clip));
    }
    add_stop_callbacks(*learn, stop, /*keeps_checkpoints=*/false);
    return learn;
  };
  DoctorProgress progress(folder, words, stop, a.report_files);
  const auto keep = keep_with_replay(progress, replay, start, arms_seconds);
  diagnose::Diagnosis d = progress.run([&] {
    return diagnose::compare_branch(at_loop,
                                                   diagnose::CompareOptions()
                                                       .epochs(1)
                                                       .lr(lr)
                                                       .one_cycle(false)
                                                       .precision(r.precision)
                                                       .precision_options(own_options)
                                                       .max_trials(a.no_trials ? 0 : a.max_trials)
                                                       .apply_setting(apply_setting)
                                                       .seed(r.seed)
                                                       .on_progress(keep),
                                                   window);
  });
  replay.seconds = arms_seconds;
  d.replay = replay;
  write_doctor_outputs(d, folder, words, a, "");
  return d;
}

} // namespace mixtrain::run
