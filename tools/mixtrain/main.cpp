// mixtrain: the command-line tool. It maps flags onto the run layer's options
// (the option table, through cli_options.h) and calls the run layer
// (mixtrain/run/commands.h); the training logic, the run folder and the doctor
// live in libmixtrain. What is left here is the terminal: flags, signals, exit
// codes and the one-line errors.
#include <mixtrain/compat.h>
#include <mixtrain/util/cpu_budget.h>
#include <mixtrain/util/option_error.h>
#include <mixtrain/util/warnings.h>
#include <mixtrain/models/failure_site.h>
#include <mixtrain/run/commands.h>
#include <mixtrain/run/stored_model.h>
#include <mixtrain/run/doctor.h>
#include <mixtrain/run/run_folder.h>
#include <mixtrain/callbacks/stop_on_request.h>

#include "cli_options.h"
#include "launch.h"

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>
#include <time.h>
#include <unistd.h>

using namespace mixtrain_cli;
namespace run = mixtrain::run;

namespace {

// ---- Interrupts: once the first training step has ended, the first SIGINT/SIGTERM
// asks for a checkpoint after the current batch; a second one exits at once.
// Before that there is nothing to save, so a signal exits at once with its own
// code (128 + the signal): a forward that never returns cannot hold a
// supervisor's single SIGTERM hostage.
// A batch still in flight kStopGraceSeconds after the stop request (a forward that
// hangs) does not hold the process either: it exits with 128 + the signal, naming the
// newest checkpoint, which is whole (checkpoints are written to a temp file and renamed).
std::atomic<bool> g_stop_requested{false};
std::atomic<bool> g_stop_agreed{false};  // data parallel: the request, agreed by all ranks
std::atomic<bool> g_stop_armed{false};   // a stop would be saved (run::StopFlags::armed)
std::atomic<int> g_stop_signal{0};       // the signal that asked for the stop
constexpr int kStopGraceSeconds = 10;

std::atomic<int64_t> g_first_stop_ms{0};  // when the stop was asked for (CLOCK_MONOTONIC)

int64_t monotonic_ms() {  // async-signal-safe
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
}

// What a stop before anything can be kept says, in one line (set by the command that runs).
const char* g_unarmed_stop_line = "mixtrain: stopped before anything could be kept\n";

extern "C" void on_stop_signal(int sig) {
  if (!g_stop_armed.load()) {
    (void)!::write(STDERR_FILENO, g_unarmed_stop_line, std::strlen(g_unarmed_stop_line));  // async-signal-safe
    ::_exit(128 + sig);
  }
  const int64_t now = monotonic_ms();
  int64_t unset = 0;
  g_first_stop_ms.compare_exchange_strong(unset, now);  // the first signal's time, before the request is seen
  if (g_stop_requested.exchange(true)) {
    // `timeout` signals the process and then its process group: the same request twice
    // within a moment. A second signal later than that is a person insisting.
    if (now - g_first_stop_ms.load() < 1000) return;
    static const char kLine[] = "mixtrain: a second stop signal: exiting at once, without a new checkpoint\n";
    (void)!::write(STDERR_FILENO, kLine, sizeof kLine - 1);  // async-signal-safe
    ::_exit(kExitInterrupted);
  }
  g_stop_signal = sig;
}

/// Watches for the stop request; `folder` is the run folder whose newest checkpoint
/// a forced exit names (empty: a default folder, named by the run's own lines).
/// Whether this process is writing a file in `folder` (write_file_atomically's NAME.tmp.PID),
/// or in its default run folder (runs/<...>-PID) when `folder` is empty: a checkpoint being
/// saved, which the stop asked for and which may take longer than the grace.
bool saving_in(const std::string& folder) {
  namespace fs = std::filesystem;
  const std::string pid = std::to_string(::getpid());
  const auto writing_here = [&](const fs::path& dir) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > pid.size() + 5 && name.compare(name.size() - pid.size() - 5, std::string::npos, ".tmp." + pid) == 0)
        return true;
    }
    return false;
  };
  if (!folder.empty()) return writing_here(folder);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("runs", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > pid.size() && name.compare(name.size() - pid.size() - 1, std::string::npos, "-" + pid) == 0 &&
        writing_here(e.path()))
      return true;
  }
  return false;
}

void watch_stop(std::string folder, std::string resume_command, bool keeps_checkpoints) {
  std::thread([folder = std::move(folder), resume_command = std::move(resume_command), keeps_checkpoints] {
    while (!g_stop_requested.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::this_thread::sleep_for(std::chrono::seconds(kStopGraceSeconds));
    // A checkpoint being written is the stop at work, however long it takes: wait for it,
    // then give the run a moment to exit on its own.
    if (keeps_checkpoints && saving_in(folder)) {
      while (saving_in(folder)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::this_thread::sleep_for(std::chrono::seconds(kStopGraceSeconds));
    }
    std::string line = "mixtrain: the batch in flight did not end within " + std::to_string(kStopGraceSeconds) +
                       " s of the stop signal; exiting without a new checkpoint";
    if (keeps_checkpoints && folder.empty()) {
      line += "; the run folder's newest checkpoint is whole: resume with: " + resume_command + " --resume FOLDER";
    } else if (keeps_checkpoints) {
      const std::string newest = run::RunFolder(folder).latest_checkpoint();
      line += newest.empty() ? "; no checkpoint has landed yet"
                             : "; the newest checkpoint is " + newest + "; resume with: " + resume_command + " --resume " + folder;
    }
    line += "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
    ::_exit(128 + g_stop_signal.load());
  }).detach();
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  // A write to a socket whose peer died (Gloo's, when another node is lost) must come
  // back as an error the run names ("lost rank 1"), not kill it with SIGPIPE (exit 141):
  // a CI run saw rank 0 die so. Python, and so torchrun's ranks, ignore it the same way.
  ::signal(SIGPIPE, SIG_IGN);
}

/// A library message for the terminal: options named as flags, first line only.
std::string in_flag_terms(const mixtrain::Phrase& message) { return message.str(run::flag_words()); }

void warn_ignored(const run::RunArgs& args, const GivenFlags& given) {
  for (const auto& w :
       run::ignored_option_warnings(args, given.keys(), mixtrain::cpu_budget().cpus_per_rank()))
    std::cerr << "mixtrain: warning: " << in_flag_terms(w) << std::endl;
}

/// `train`'s arguments: its flags, or with --resume the run's own recorded ones.
run::RunArgs train_args(const GivenFlags& given) {
  if (!given.has("resume")) return apply_flags(run::Command::kTrain, given);
  const std::string folder = given.values.at("resume");
  // A resumed run uses its own recorded flags; only --threads may differ.
  for (const auto& key : given.keys())
    if (key != "resume" && key != "threads")
      throw UsageError("--resume takes the run's flags from " + folder + "/args.json; do not pass " +
                       run::find_option(key)->flag);
  const run::RunArgs threads = apply_flags(run::Command::kTrain, given);
  return run::resume_args(folder, given.has("threads") ? threads.config.threads : -1);
}

int run_train(const GivenFlags& given) {
  run::RunArgs args = train_args(given);
  run::choose_for_model_file(args, run::Command::kTrain);  // a bf16 model file's mode, before the warnings
  if (!given.has("resume")) warn_ignored(args, given);
  g_unarmed_stop_line = "mixtrain train: stopped before its first step ended: there was nothing to save\n";
  install_stop_handlers();
  watch_stop(args.out, "mixtrain train", /*keeps_checkpoints=*/true);
  const run::TrainResult r = run::train(args, {&g_stop_requested, &g_stop_agreed, &g_stop_armed});
  switch (r.end) {
    case run::TrainResult::End::kFinished:
      return 0;
    case run::TrainResult::End::kInterrupted:
      if (!r.checkpoint.empty()) {  // rank 0 wrote it
        const std::string again =
            r.world_size > 1 ? "mixtrain launch --nproc " + std::to_string(r.world_size) + " -- train" : "mixtrain train";
        std::cerr << "mixtrain: interrupted; checkpoint saved to " << r.checkpoint << "; resume with: " << again
                  << " --resume " << r.folder << std::endl;
      }
      return kExitInterrupted;
    case run::TrainResult::End::kStopped:
      std::cerr << "mixtrain: stopped: " << in_flag_terms(r.message) << std::endl;
      return 1;
  }
  return 1;
}

/// The one-line error every failure ends with, written in one piece: under
/// mixtrain launch a rank may be stopped at any moment once a peer has failed,
/// and a line written piecewise could be cut after "mixtrain: error: ".
void print_error(const std::string& message) {
  const std::string line = "mixtrain: error: " + message.substr(0, message.find('\n')) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

struct Subcommand {
  run::Command command;
  CLI::App* app = nullptr;
  GivenFlags given;
};

} // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) then fails a write with EFBIG, which the run reports
  // as a full disk (which checkpoint is intact, how to resume), instead of a silent kill.
  std::signal(SIGXFSZ, SIG_IGN);
  // The library's warnings (a fit that lost most updates, NaN inputs) in the CLI's words.
  const mixtrain::WarningsTo warnings([](const mixtrain::Phrase& w) {
    std::cerr << "mixtrain: warning: " << w.str(run::flag_words()) << std::endl;
  });
  CLI::App app{"mixtrain: mixed-precision training for libtorch, fastai-style.", "mixtrain"};
  app.set_version_flag("--version", "mixtrain " MIXTRAIN_VERSION " (built against torch " +
                                        mixtrain::compat::built_torch_version() + ")");
  app.require_subcommand(1);
  // The torch this process loaded must be the one it was built against: said now, in one
  // line, not as an undefined symbol (exit 127) in the middle of a run.
  if (const std::string mismatch = mixtrain::compat::torch_mismatch(); !mismatch.empty()) {
    print_error(mismatch);
    return kExitError;
  }
  Subcommand train{run::Command::kTrain}, doctor{run::Command::kDoctor}, lr_find{run::Command::kLrFind};
  train.app = app.add_subcommand("train", "Train a model (built-in or TorchScript) with fit_one_cycle and write OUT/model.pt");
  doctor.app = app.add_subcommand(
      "doctor",
      "Diagnose mixed precision: an fp32 baseline and an fp16 (or bf16) run with the same seed, weights, data "
      "order and schedule; prints a verdict with evidence and fixes, writes OUT/diagnosis.json, loss.svg and "
      "scale.svg. Exit 0 healthy, 1 problem found, 2 error");
  lr_find.app = app.add_subcommand(
      "lr_find", "fastai's learning-rate finder: sweeps the lr from --start-lr to --end-lr over --num-it steps, prints "
                 "the suggestions (valley, steep, minimum/10), writes OUT/lr_find.svg and OUT/lr_find.csv");
  for (Subcommand* s : {&train, &doctor, &lr_find}) add_flags(*s->app, s->command, s->given);
  LaunchOptions launch_options;
  CLI::App* launch_cmd = add_launch_subcommand(app, launch_options);

  // `launch ... -- COMMAND`: CLI11 parses launch's own flags; everything after "--"
  // is the ranks' command, kept out of CLI11's hands.
  std::vector<std::string> command;
  int cli_argc = argc;
  if (argc > 1 && std::string(argv[1]) == "launch")
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "--") {
        command.assign(argv + i + 1, argv + argc);
        cli_argc = i;
        break;
      }

  try {
    // A flag another subcommand takes gets a sentence of its own, not CLI11's "not expected".
    for (Subcommand* s : {&train, &doctor, &lr_find})
      if (argc > 1 && std::string(argv[1]) == s->app->get_name())
        reject_foreign_flags(s->command, std::vector<std::string>(argv + 2, argv + argc));
    app.parse(cli_argc, argv);
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11 says "--bs: At Most 1 required but received 2" for a flag given twice.
    const std::string what = e.what();
    const std::string flag = what.substr(0, what.find(':'));
    const bool named = flag.rfind("--", 0) == 0;
    print_error(named && what.find("At Most") != std::string::npos ? flag + " is given more than once; give it once"
                : named && what.find("missing") != std::string::npos ? flag + " needs a value (see mixtrain --help)"
                                                                     : what + " (see mixtrain --help)");
    return kExitError;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    print_error(std::string(e.what()) + " (see mixtrain --help)");
    return kExitError;
  } catch (const UsageError& e) {
    print_error(e.what());
    return kExitError;
  }

  try {
    if (launch_cmd->parsed()) {
      check_launch(launch_options, command);
      return launch("/proc/self/exe", command, launch_options);
    }
    if (train.app->parsed()) return run_train(train.given);
    if (lr_find.app->parsed()) {
      run::RunArgs args = apply_flags(run::Command::kLrFind, lr_find.given);
      run::choose_for_model_file(args, run::Command::kLrFind);
      warn_ignored(args, lr_find.given);
      run::lr_find(args);
      return 0;
    }
    if (doctor.app->parsed()) {
      run::RunArgs args = apply_flags(run::Command::kDoctor, doctor.given);
      run::choose_for_model_file(args, run::Command::kDoctor);
      warn_ignored(args, doctor.given);
      // Until the verdict is written a stop signal exits at once; during the trials
      // it ends the trial in flight, and diagnosis.json keeps what is known.
      g_unarmed_stop_line = "mixtrain doctor: stopped before the verdict: nothing was kept (the fp32 and mixed runs "
                            "train first; the verdict is written before the first trial)\n";
      install_stop_handlers();
      watch_stop("", "", /*keeps_checkpoints=*/false);
      return run::doctor(args, run::flag_words(), {&g_stop_requested, nullptr, &g_stop_armed}).healthy() ? 0 : 1;
    }
  } catch (const mixtrain::callbacks::StopRequested&) {
    return kExitInterrupted;  // run::doctor said what it kept
  } catch (const UsageError& e) {
    print_error(e.what());
  } catch (const mixtrain::OptionError& e) {
    print_error(e.message(run::flag_words()));
  } catch (const c10::Error& e) {
    print_error(mixtrain::innermost_message(e));  // a TorchScript traceback's own error, not its header
  } catch (const std::exception& e) {
    print_error(mixtrain::innermost_message(e));
  }
  return kExitError;
}
