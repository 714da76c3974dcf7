#pragma once
// The CLI's flags: `train` and `doctor` map them onto a mixtrain::RunConfig and
// the CLI-only switches below; nothing here trains.

#include <mixtrain/run_config.h>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mixtrain_cli {

constexpr int kExitError = 2;

/// A user error: printed as one line, exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// `train`'s and `doctor`'s flags: the run's settings and the CLI-only switches.
struct TrainArgs {
  mixtrain::RunConfig run;
  std::string out;                       // empty: runs/<timestamp>
  std::string resume;                    // run directory to continue
  bool force = false;                    // reuse an --out that holds checkpoints
  int64_t interrupt_at_step = -1;        // testing aid: raise SIGINT after this training step
  int64_t abort_at_step = -1;            // testing aid: the last rank aborts after this step
  int64_t inject_overflow_at_step = -1;  // testing aid: the last rank's gradients get an inf at this step
  double timeout = 60;                   // data parallel: seconds to wait for the other ranks
};

/// Adds the flags `train` takes to `cmd`; `doctor` takes the same minus the
/// train-only ones (`for_doctor`).
void add_train_flags(CLI::App& cmd, TrainArgs& a, bool for_doctor = false);

/// Checks every flag value; throws UsageError (or c10::Error from the library's
/// own option checks) with one line naming the flag. `check_device`: also refuse
/// a precision this CPU cannot run (train; for doctor that is a verdict).
void validate(const TrainArgs& a, bool check_device);

/// Whether `name` is one of the built-in models (else --model is a TorchScript file).
bool is_builtin_model(const std::string& name);

/// The library's messages name API calls and options; the CLI's users know flags.
/// Rewrites the phrases the library uses into the flags that set them.
std::string in_flag_terms(std::string message);

/// One line for each given flag that does nothing in the chosen mode (or asks for
/// more threads than `cores`).
std::vector<std::string> ignored_flag_warnings(const CLI::App& cmd, const mixtrain::RunConfig& r, int cores);

/// Creates the run directory and proves it is writable before any training starts.
void prepare_out_dir(const std::string& out);

/// runs/<timestamp>-<pid>: unique for runs started in the same second.
std::string default_run_dir(const std::string& prefix);

} // namespace mixtrain_cli
