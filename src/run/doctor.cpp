// The doctor's three ways in (mixtrain/run/doctor.h), over one DoctorSession: from scratch,
// from a run's checkpoint (what it shares with train --from is branch_point.h; the run's
// steps.csv read back is run_steps.h), and from a training loop's state (loop_state.h).
#include "mixtrain/run/doctor.h"
#include "mixtrain/run/stored_model.h"

#include "branch_point.h"
#include "run_steps.h"
#include "util/short_number.h"

#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/callbacks/checkpointer.h"
#include "mixtrain/callbacks/gradient_clip.h"
#include "mixtrain/callbacks/stop_on_request.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/diagnose/plots.h"
#include "mixtrain/run/learner_builder.h"
#include "mixtrain/run/loop_state.h"
#include "mixtrain/run/model_registry.h"
#include "mixtrain/run/run_folder.h"
#include "mixtrain/util/atomic_file.h"
#include "mixtrain/util/option_error.h"

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>

namespace mixtrain::run {

using mixtrain::detail::short_number;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// What the calling thread checks while it waits for an arm on another (side by side): the
/// front end's stop poll, which only its own thread can run (Python's signal handlers).
std::function<void()> stop_check(const StopFlags& stop) {
  return [stop] {
    if (stop.poll && stop.requested && stop.poll()) stop.requested->store(true);
  };
}

/// RunArgs::out as the doctor writes into it: a new doctor-<time> folder when none is
/// given, and the folder the path names once created (RunFolder::resolve).
std::string doctor_out(RunArgs& a) {
  if (a.out.empty()) a.out = RunFolder::default_path("doctor-");
  a.out = RunFolder::resolve(a.out);
  return a.out;
}

/// What the three doctors share, so that they cannot drift apart: their own folder (never
/// a run's), diagnosis.json while the comparison runs (kept with the verdict before the
/// first trial and again as each trial ends; from then on a stop has something to keep,
/// StopFlags::armed, and a stop marks it "interrupted" and says where it is), the
/// comparison's options as the run's config gives them, and the outputs.
class DoctorSession {
 public:
  /// Refuses an out folder that holds a run (its charts would be overwritten).
  DoctorSession(RunArgs& a, const OptionWords& words, const StopFlags& stop)
      : a_(a), words_(words), stop_(stop), folder_(doctor_out(a)) {
    folder_.refuse_run("the doctor");
  }
  /// Creates the folder: every input has been checked by now.
  void open() const { folder_.prepare(); }
  /// A replayed window: diagnosis.json holds `replay` from the first keep on, its seconds
  /// (restoring and both arms, to the verdict) counted from now.
  void replays(diagnose::Replay& replay) {
    replay_ = &replay;
    start_ = std::chrono::steady_clock::now();
  }
  /// The comparison's options from the run's config: its precision (with `own`, the
  /// run's rounding seed), schedule and trials, diagnosis.json kept at each progress.
  diagnose::CompareOptions options(const RunConfig& r, const PrecisionOptions& own, double lr) {
    return diagnose::CompareOptions()
        .epochs(r.epochs)
        .lr(lr)
        .precision(r.precision)
        .precision_options(own)
        .max_trials(a_.no_trials ? 0 : a_.max_trials)
        .apply_setting(apply_setting)
        .seed(r.seed)
        .on_progress([this](const diagnose::Diagnosis& now) { keep(now); });
  }
  /// Runs the comparison; a stop once the verdict is known writes it as interrupted, says
  /// so on stderr and is rethrown (a stop before it is rethrown as it is: nothing to keep).
  diagnose::Diagnosis run(const std::function<diagnose::Diagnosis()>& compare) {
    try {
      diagnose::Diagnosis d = compare();
      with_replay(d);
      return d;
    } catch (const callbacks::StopRequested&) {
      if (!known_) throw;
      known_->trials_status = "interrupted";
      write_file_atomically(folder_.file("diagnosis.json"), known_->to_json(words_));
      std::cerr << "mixtrain doctor: stopped during trial " << known_->trials.size() + 1 << "; verdict "
                << diagnose::to_string(known_->verdict) << " and the " << known_->trials.size() << " trial(s) that ended "
                << (a_.report_files ? "are in " + folder_.file("diagnosis.json")
                                    : std::string("were known (no out= folder keeps them: pass out= to keep diagnosis.json)"))
                << std::endl;
      throw;
    }
  }
  /// diagnosis.json and the charts, then the report (unless RunArgs::says_report is false)
  /// followed by `next` (what to run with the proven fix, in the front end's words), and
  /// the files written (RunArgs::report_files).
  void finish(const diagnose::Diagnosis& d, const std::string& next) const {
    write_file_atomically(folder_.file("diagnosis.json"), d.to_json(words_));
    std::vector<std::string> written{folder_.file("diagnosis.json")};
    for (const auto& [name, svg] : doctor_charts(d)) {
      write_file_atomically(folder_.file(name + ".svg"), svg);
      written.push_back(folder_.file(name + ".svg"));
    }
    if (a_.says_report) std::cout << "\n" << d.report(words_) << next;
    if (a_.report_files) {
      std::cout << "written:";
      for (const auto& w : written) std::cout << " " << w;
    }
    std::cout << std::endl;
  }

 private:
  void keep(const diagnose::Diagnosis& now) {
    known_ = now;
    with_replay(*known_);
    write_file_atomically(folder_.file("diagnosis.json"), known_->to_json(words_));
    if (stop_.armed) stop_.armed->store(true);  // from here a stop has something to save
  }
  void with_replay(diagnose::Diagnosis& d) {
    if (!replay_) return;
    if (arms_seconds_ < 0) arms_seconds_ = seconds_since(start_);
    replay_->seconds = arms_seconds_;
    d.replay = *replay_;
  }

  RunArgs& a_;
  const OptionWords& words_;
  StopFlags stop_;
  RunFolder folder_;
  std::optional<diagnose::Diagnosis> known_;
  diagnose::Replay* replay_ = nullptr;
  std::chrono::steady_clock::time_point start_;
  double arms_seconds_ = -1;
};

} // namespace

// ---- from scratch ----

namespace {

diagnose::Diagnosis doctor_from_scratch(RunArgs a, const OptionWords& words, const StopFlags& stop) {
  for (const auto& [key, given] : {std::pair<std::string, bool>{"at", a.at != -1}, {"window", a.window != -1}})
    if (given)
      throw OptionError(key, Phrase::name(key) + " picks what " + Phrase::name("from_run") +
                                 " replays; without it the doctor trains both runs from scratch");
  const RunTurn turn;
  choose_for_model_file(a, Command::kDoctor);
  validate(a, Command::kDoctor);
  const RunConfig& r = a.config;
  check_doctor_compares(r.precision);
  if (!r.lr.one_for_all())
    throw OptionError("lr", "mixtrain doctor takes one " + Phrase::name("lr") + ", got " + r.lr.str() +
                                " (it trains the model as one parameter group)");
  const RunStart start = start_run(a, /*world_size=*/1);
  const data::DatasetSplit& split = start.split;
  // A bad island is an error before the baseline trains.
  if (!r.precision_options.keep_fp32().empty()) amp::check_islands(r.precision_options.keep_fp32(), build_model(a).module());
  // So is the model's fit to both splits, before the folder is created (the runs build their own).
  (void)build_learner(a, split, /*progress=*/false);
  DoctorSession session(a, words, stop);
  session.open();

  int built = 0;
  diagnose::LearnerFactory factory = [&]() {
    // The two runs say what they are; a trial's own line ("doctor: trial 1: ...") says what it runs.
    if (built < 2)
      std::cout << (built == 0 ? "doctor: 1/2 fp32 baseline"
                               : "doctor: 2/2 " + precision_name(r.precision) + " run, same seed, weights and data order")
                << std::endl;
    ++built;
    auto learn = build_learner(a, split, /*progress=*/true);
    add_stop_callbacks(*learn, stop, /*keeps_checkpoints=*/false);
    return learn;
  };
  std::cout << "mixtrain doctor: model " << r.model << ", " << split.train.size() << " train samples, " << r.epochs
            << " epoch(s), lr " << r.lr.last() << ", bs " << r.bs << ", fp32 vs " << precision_name(r.precision) << ", "
            << threads_words(start) << std::endl;
  const diagnose::CompareOptions options =
      session.options(r, PrecisionOptions(r.precision_options).rounding_seed(r.seed), r.lr.last())
          .side_by_side(true)  // build_learner's Learners share nothing
          .head_start(a.head_start)
          .while_waiting(stop_check(stop));
  const diagnose::Diagnosis d = session.run([&] { return diagnose::compare(factory, options); });
  session.finish(d, "");
  return d;
}

} // namespace

diagnose::Diagnosis doctor(RunArgs a, const OptionWords& words, const StopFlags& stop) {
  if (!a.from_run.empty()) return doctor_from(std::move(a), words, stop);
  if (a.loop) return doctor_from_loop(std::move(a), words, stop);
  return doctor_from_scratch(std::move(a), words, stop);
}

// ---- from a run's checkpoint ----

namespace {

/// The run's own arguments, for a doctor of RunArgs::from_run: its args.json, with only the
/// thread count and the front end's model and data (a run trained from Python) taken from
/// `a`; any other flag given is refused, rather than silently ignored. `as_written`:
/// args.json before one process takes a data-parallel run's global batch; `one_process`:
/// what that means, in words (as_one_process).
RunArgs branch_args(const RunArgs& a, const RunFolder& run, RunConfig& as_written, std::string& one_process) {
  const std::string& from = run.path();
  const RunArgs defaults = defaults_for(Command::kDoctor);
  for (const Option& o : options()) {
    if (!o.stored || o.key == "threads" || !was_given(o, a, defaults)) continue;
    throw OptionError(o.key, Phrase::name("from_run") + " replays the run with its own flags (" + from + "/args.json); drop " +
                                 Phrase::name(o.key));
  }
  RunArgs b;
  try {
    b.config = run.read_config();
  } catch (const c10::Error& e) {
    throw OptionError("from_run", "cannot branch from " + from + ": " + e.msg());
  }
  as_written = b.config;
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
  one_process = as_one_process(b.config, "replayed");
  if (!r.lr.one_for_all())
    throw OptionError("from_run", "cannot branch from " + from + ": its " + Phrase::name("lr") + " " + r.lr.str() +
                                      " is one per parameter group; the doctor replays one");
  return b;
}

/// Where a doctor --from replays: the checkpoint (read once), the window, and why there.
struct ReplayPoint {
  std::string checkpoint;
  BranchPoint point;
  int64_t window = -1;
  std::vector<std::string> notes;
};

/// The newest checkpoint before `onset` with finite weights, and (unless given) a window
/// that reaches past the onset by half the way there, at least kMinCompareSteps: what
/// the doctor sees there is how the run went wrong, not a state it had already lost
/// (a scale collapsed by its back-offs, which every trial would inherit). False when no
/// checkpoint comes before it.
template <typename LeftAfter, typename Restored>
bool place_before(const Onset& onset, const std::vector<std::string>& checkpoints, const LeftAfter& left_after,
                  const Restored& restored, ReplayPoint& at) {
  for (const auto& c : checkpoints) {  // newest first
    const int64_t step = step_of(c);
    if (step >= onset.step || left_after(c) <= onset.step - step) continue;
    BranchPoint candidate = read_branch_point(c);
    if (!weights_finite(*restored(candidate))) continue;
    const int64_t to_onset = onset.step - step;
    if (at.window < 0)
      at.window = std::min(left_after(c), std::max(kDefaultWindow, to_onset + std::max<int64_t>(diagnose::kMinCompareSteps, to_onset / 2)));
    at.checkpoint = c;
    at.point = std::move(candidate);
    at.notes.push_back("the run did not finish; it went wrong at step " + std::to_string(onset.step) + " (" + onset.what +
                       "): branched from " + c + ", before it, for " + std::to_string(at.window) + " steps, to step " +
                       std::to_string(step + at.window) +
                       (step + at.window > onset.step ? " (" + std::to_string(step + at.window - onset.step) + " past it)"
                                                      : std::string()));
    return true;
  }
  return false;
}

/// A run that did not finish, with no checkpoint before it went wrong: the state it stopped
/// in, unless its weights are no longer finite (then the newest finite one before it).
template <typename Restored>
void place_at_stop(const std::string& from, const std::vector<std::string>& checkpoints, const Restored& restored,
                   const RunConfig& r, ReplayPoint& at) {
  at.checkpoint = checkpoints.front();
  for (size_t i = 0; i < checkpoints.size(); ++i) {
    BranchPoint candidate = read_chosen_point(checkpoints[i], checkpoints, /*chosen=*/true);
    if (weights_finite(*restored(candidate))) {
      at.checkpoint = checkpoints[i];
      at.point = std::move(candidate);
      break;
    }
    if (i + 1 == checkpoints.size())
      throw OptionError("from_run", "cannot branch from " + from + ": the weights of every checkpoint are NaN/inf");
    at.notes.push_back("the weights of " + checkpoints[i] + " are NaN/inf: branched from the checkpoint before it");
  }
  at.notes.push_back(std::string("the run did not finish: branched from ") +
                     (at.checkpoint == checkpoints.front() ? "the state it stopped in" : "the last finite state before it"));
  if (mode_of(r.precision).grad_scaler) {
    const std::unique_ptr<Learner> at_stop = restored(at.point);
    std::string said;
    if (const auto pc = at_stop->precision_cb(); pc && pc->loss_scaled()) working_scale(at_stop->recorder(), pc->loss_scale(), &said);
    if (!said.empty()) at.notes.push_back(said + " (the trials; the run's own replay keeps its scale)");
  }
}

/// The window's checks against the run's schedule (`total_steps`), once the checkpoint is chosen.
void check_window(const ReplayPoint& at, int64_t total_steps) {
  const int64_t step = step_of(at.checkpoint);
  const int64_t left = total_steps - step;
  if (at.window > left)
    throw OptionError("window", "a " + Phrase::name("window") + " of " + std::to_string(at.window) + " steps from step " +
                                    std::to_string(step) + " runs past the end of the run's schedule (" +
                                    std::to_string(total_steps) + " steps): at most " + std::to_string(left));
  if (left <= 0)
    throw OptionError("at", at.checkpoint + " is at step " + std::to_string(step) + ", the end of the run's schedule (" +
                                std::to_string(total_steps) + " steps): nothing is left to replay; pick an earlier one with " +
                                Phrase::name("at"));
  if (at.window < diagnose::kMinCompareSteps)
    throw OptionError("window", "the run's schedule has " + std::to_string(left) + " step(s) left after " + at.checkpoint +
                                    ", too few to judge (at least " + std::to_string(diagnose::kMinCompareSteps) +
                                    "); pick an earlier one with " + Phrase::name("at"));
}

/// Picks where to replay (RunArgs::at; else before the run went wrong; else where a stopped
/// run stopped; else the newest checkpoint the run went on from for a whole window) and
/// reads it once; the window is RunArgs::window, else chosen with it (check_window checks
/// it). `restored` builds a Learner from a branch point.
template <typename Restored>
ReplayPoint choose_replay(const RunArgs& a, const RunFolder& run, const RunConfig& r, const StepsCsv& csv,
                          int64_t total_steps, const Restored& restored) {
  const std::string& from = run.path();
  const std::vector<std::string> checkpoints = callbacks::Checkpointer::newest_first(from);
  const auto left_after = [&](const std::string& c) { return total_steps - step_of(c); };
  const bool stopped = !run.finished();
  ReplayPoint at;
  at.window = a.window;
  if (a.at >= 0) {
    at.checkpoint = checkpoint_at(from, checkpoints, a.at);
  } else if (const Onset onset = onset_of_failure(csv); stopped && onset.step > 0 &&
                                                        place_before(onset, checkpoints, left_after, restored, at)) {
    // Branched before the run went wrong, with a window that reaches past it.
  } else if (stopped) {
    place_at_stop(from, checkpoints, restored, r, at);
  } else {
    const int64_t wanted = at.window >= 0 ? at.window : kDefaultWindow;
    for (const auto& c : checkpoints)
      if (left_after(c) >= wanted) {
        at.checkpoint = c;
        break;
      }
    if (at.checkpoint.empty()) at.checkpoint = checkpoints.back();  // the earliest: the longest window there is
    if (at.checkpoint != checkpoints.front())
      at.notes.push_back("the newest checkpoint the run went on from for " + std::to_string(std::min(wanted, left_after(at.checkpoint))) +
                         " steps (the newest, " + checkpoints.front() + ", leaves " +
                         std::to_string(left_after(checkpoints.front())) + ")");
  }
  if (at.point.path != at.checkpoint) at.point = read_chosen_point(at.checkpoint, checkpoints, a.at < 0);
  if (at.window < 0) at.window = std::min(kDefaultWindow, left_after(at.checkpoint));
  return at;
}

/// Where the replay starts, as diagnosis.json and the report say it, with the run's own
/// record; printed as the doctor's first lines.
diagnose::Replay announce_replay(const RunFolder& run, const RunConfig& r, const ReplayPoint& at, const StepsCsv& csv,
                                 const std::string& threads) {
  diagnose::Replay replay;
  replay.from = run.path();
  replay.checkpoint = at.checkpoint;
  replay.step = step_of(at.checkpoint);
  replay.window = at.window;
  replay.notes = at.notes;
  replay.record = run_record(run, csv);
  std::cout << "mixtrain doctor: branching " << run.path() << " (model " << r.model << ", precision "
            << precision_name(r.precision) << ") from " << at.checkpoint << ": " << at.window << " steps in fp32 and in "
            << precision_name(r.precision) << ", " << threads << std::endl;
  std::cout << "the run's own record:" << std::endl;
  for (const auto& line : replay.record) std::cout << "  " << line << std::endl;
  return replay;
}

} // namespace

diagnose::Diagnosis doctor_from(RunArgs a, const OptionWords& words, const StopFlags& stop) {
  const RunTurn turn;
  const std::string from = a.from_run;
  const RunFolder run(from);
  std::error_code ec;
  if (!std::filesystem::is_directory(from, ec))
    throw OptionError("from_run", Phrase::name("from_run") + " " + from + " is not a run folder (no such directory, or not a directory)");
  RunConfig as_written;
  std::string one_process;
  const RunArgs b = branch_args(a, run, as_written, one_process);
  const RunConfig& r = b.config;
  if (a.at < -1) throw OptionError("at", "invalid " + Phrase::name("at") + " " + std::to_string(a.at) + ": a training step is >= 0");
  if (a.window != -1 && a.window < diagnose::kMinCompareSteps)
    throw OptionError("window", "a " + Phrase::name("window") + " of " + std::to_string(a.window) +
                                    " step(s) is too short to judge; the comparison needs at least " +
                                    std::to_string(diagnose::kMinCompareSteps));
  if (callbacks::Checkpointer::newest_first(from).empty())
    throw OptionError("from_run", "cannot branch from " + from + ": it holds no checkpoint (train with " +
                                      Phrase::name("save_every") + " or " + Phrase::name("save_every_steps") + ")");
  if (std::filesystem::weakly_canonical(doctor_out(a), ec) == std::filesystem::weakly_canonical(from, ec))
    throw OptionError("out", "the doctor writes into its own " + Phrase::name("out") + ", not into the run folder " + from);
  DoctorSession session(a, words, stop);

  const RunStart prepared = start_run(b, /*world_size=*/1);
  const PrecisionOptions own_options = PrecisionOptions(r.precision_options).rounding_seed(r.seed);
  // A Learner as the run built it, with the checkpoint loaded as a resume loads it.
  const auto restored = [&](const BranchPoint& point) {
    std::unique_ptr<Learner> learn = build_learner(b, prepared.split, /*progress=*/false);
    learn->set_precision(r.precision, own_options);
    load_branch_point(*learn, point);
    learn->recorder().start_branch();  // each arm's smoothed loss starts at the branch
    return learn;
  };
  const int64_t total_steps = r.epochs * build_learner(b, prepared.split, /*progress=*/false)->dls().train.num_batches();
  const StepsCsv csv = read_steps_csv(run.file("steps.csv"));
  ReplayPoint at = choose_replay(a, run, r, csv, total_steps, restored);
  check_recorded_run(as_written, at.checkpoint, at.point.bytes, "cannot branch from " + from);
  check_window(at, total_steps);
  session.open();  // everything is checked: the doctor's own folder is created now (never the run's)

  if (!one_process.empty()) at.notes.push_back(one_process);
  diagnose::Replay replay = announce_replay(run, r, at, csv, threads_words(prepared));

  std::chrono::steady_clock::time_point fp32_ready;
  const diagnose::BranchFactory at_branch = [&](diagnose::Arm arm, const diagnose::MixedRun& trial) {
    const auto entered = std::chrono::steady_clock::now();
    // The fp32 arm ran from when its Learner was ready until the run's arm is asked for.
    if (arm == diagnose::Arm::kRun && replay.restore_seconds > 0) replay.fp32_arm_seconds = seconds_since(fp32_ready);
    if (arm == diagnose::Arm::kFp32) std::cout << "doctor: 1/2 fp32 from the checkpoint" << std::endl;
    if (arm == diagnose::Arm::kRun)
      std::cout << "doctor: 2/2 " << precision_name(r.precision) << " from the checkpoint (the run, continued)" << std::endl;
    std::unique_ptr<Learner> learn = restored(at.point);
    if (arm == diagnose::Arm::kFp32) {
      learn->to_fp32();
      replay.restore_seconds = seconds_since(entered);
      fp32_ready = std::chrono::steady_clock::now();
    } else if (arm == diagnose::Arm::kTrial) {
      convert_precision(*learn, trial.precision, trial.options, trial.clip, own_options);
    }
    add_stop_callbacks(*learn, stop, /*keeps_checkpoints=*/false);
    return learn;
  };
  session.replays(replay);
  diagnose::Diagnosis d = session.run(
      [&] { return diagnose::compare_branch(at_branch, session.options(r, own_options, r.lr.last()), at.window); });
  if (as_written.ranks > 1)
    replay.not_compared = "the run was trained by " + std::to_string(as_written.ranks) +
                          " ranks and replayed in one process, which adds their gradients in another order: not bitwise the run";
  else if (d.evidence.mixed)
    check_replay(replay, *d.evidence.mixed, csv);
  d.replay = replay;
  std::string next;
  if (d.proven_fix)
    next = "continue the run with it: " + train_command(as_written.ranks) + " --from " + from + " --at " +
           std::to_string(replay.step) + " --out NEW_DIR " + d.trials[*d.proven_fix].settings_in(flag_words()) + "\n";
  session.finish(d, next);
  return d;
}

// ---- from a training loop's state ----

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
  const data::DatasetSplit& split = prepared.split;
  const int64_t window = split.train.size() / r.bs;
  if (window < diagnose::kMinCompareSteps)
    throw OptionError("window", "a window of " + std::to_string(window) + " step(s) is too short to judge; the comparison needs at least " +
                                    std::to_string(diagnose::kMinCompareSteps));
  // The loop's own rounding seed: the arm and the trials round as the loop's optimizer would.
  const PrecisionOptions own_options = PrecisionOptions(r.precision_options).rounding_seed(loop.rounding_seed);
  if (!own_options.keep_fp32().empty()) amp::check_islands(own_options.keep_fp32(), build_model(a).module());
  DoctorSession session(a, words, stop);
  session.open();

  diagnose::Replay replay;
  replay.checkpoint = "the training loop's state";
  replay.step = loop_step(loop);
  replay.window = window;
  replay.not_compared = "a training loop records no steps to check it against";
  std::cout << "mixtrain doctor: branching the training loop (" << loop.optimizer
            << (replay.step >= 0 ? ", optimizer step " + std::to_string(replay.step) : std::string()) << ", lr "
            << short_number(lr, 3) << "): its next " << window << " batches in fp32 and in " << precision_name(r.precision)
            << ", " << threads_words(prepared) << std::endl;
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
  session.replays(replay);
  const diagnose::Diagnosis d = session.run(
      [&] {
        return diagnose::compare_branch(at_loop,
                                        session.options(r, own_options, lr)
                                            .one_cycle(false)
                                            .side_by_side(true)  // build_learner's Learners share nothing
                                            .while_waiting(stop_check(stop)),
                                        window);
      });
  session.finish(d, "");
  return d;
}

// ---- what the three share with their callers ----

std::map<std::string, std::string> doctor_charts(const diagnose::Diagnosis& d) {
  std::map<std::string, std::string> charts;
  if (d.evidence.fp32 || d.evidence.mixed) charts["loss"] = diagnose::loss_curves_svg(d.evidence, d.trials);
  if (d.evidence.mixed && d.evidence.mixed->scale.has_scale) charts["scale"] = diagnose::scale_history_svg(*d.evidence.mixed);
  return charts;
}

void check_doctor_compares(Precision precision) {
  if (mode_of(precision).doctor_compares) return;
  Phrase modes;
  const std::vector<Precision> compared = modes_where(&PrecisionMode::doctor_compares);
  for (size_t i = 0; i < compared.size(); ++i)
    modes += (i == 0 ? "" : i + 1 == compared.size() ? " or " : ", ") + Phrase::setting("precision", precision_name(compared[i]));
  throw OptionError("precision", "the doctor compares fp32 with " + modes + " (default: fp16), not " + precision_name(precision));
}

void apply_setting(const diagnose::Setting& setting, diagnose::MixedRun& run) {
  const Option* o = find_option(setting.key);
  TORCH_INTERNAL_ASSERT(o, "a trial sets '", setting.key, "', which is no option");
  RunArgs a;
  a.config.precision = run.precision;
  a.config.precision_options = run.options;
  a.config.clip = run.clip;
  o->set(a, setting.value);
  run.precision = a.config.precision;
  run.options = a.config.precision_options;
  run.clip = a.config.clip;
}

} // namespace mixtrain::run
