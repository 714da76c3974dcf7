#pragma once
/// The option table: every option of a run described once. Its key (args.json's,
/// the Python keyword, the key an OptionError carries), its CLI flag, its help,
/// the commands that take it, the precision modes it applies to, its default and
/// whether it came after the first release. From it come args.json reading and
/// writing, each subcommand's flags and help, the ignored-flag warnings, the
/// words a front end names options in, and the Python keyword arguments.
///
/// Example (a front end setting options by key, as the CLI and Python do):
///   mixtrain::run::RunArgs args = mixtrain::run::defaults_for(mixtrain::run::Command::kTrain);
///   mixtrain::run::find_option("init_scale")->set(args, "256");
///   mixtrain::run::validate(args, mixtrain::run::Command::kTrain);

#include "mixtrain/core/lr_find.h"
#include "mixtrain/util/phrase.h"
#include "mixtrain/run/run_config.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain {
class Model;
namespace data {
struct DatasetSplit;
} // namespace data
} // namespace mixtrain

namespace mixtrain::run {

struct LoopState;

/// The things a run can be asked to do; each takes its own options.
enum class Command : unsigned {
  kTrain = 1,   ///< train a model (mixtrain train)
  kDoctor = 2,  ///< compare fp32 with mixed precision and judge (mixtrain doctor)
  kLrFind = 4,  ///< fastai's learning-rate finder (mixtrain lr_find)
};
/// "train", "doctor", "lr_find".
const char* command_name(Command command);

/// Everything a front end can set: the run's configuration (kept in args.json)
/// and how this invocation runs it (where, resume or not, testing aids).
struct RunArgs {
  RunConfig config;
  std::string out;              ///< the run folder (empty: runs/<prefix><timestamp>)
  std::string resume;           ///< continue the run in this folder (train)
  bool force = false;           ///< start over in a folder that holds checkpoints
  double timeout = 60;          ///< data parallel: seconds to wait for the other ranks
  LrFindOptions lr_find;        ///< the sweep's range and length (lr_find)
  int64_t max_trials = 4;       ///< doctor: candidate fixes tried after a problem verdict
  bool no_trials = false;       ///< doctor: try none
  bool head_start = false;      ///< doctor: lost_updates' first trial before the verdict (faster, not repeatable bitwise)
  std::string from_run;         ///< doctor: replay a window from this run folder's checkpoint
  int64_t at = -1;              ///< doctor --from: the checkpoint's step (-1: chosen)
  int64_t window = -1;          ///< doctor --from: training steps replayed (-1: the default)
  /// The keys the front end was given (the CLI's flags): with --from, a given option is
  /// judged even when its value is the default (--model cnn against a run of the mlp).
  /// Options not listed count as given when they differ from the default.
  std::vector<std::string> given;
  /// A model in memory instead of config.model (the Python front door: the
  /// user's module). Called once per Learner the command builds, it returns a
  /// Model for `config` (its output and loss): the doctor builds several and
  /// copies the first one's initial weights into the others.
  std::function<Model(const RunConfig&)> model_source;
  /// Data in memory instead of config.data (the Python front door: the user's tensors).
  std::shared_ptr<const data::DatasetSplit> data_source;
  /// A training loop's optimizer state to branch from (the Python doctor's optimizer=):
  /// the doctor replays the loop's next batches from it (run/branch.h).
  std::shared_ptr<const LoopState> loop;
  /// Whether the command says which files it wrote where (false: a front end's
  /// temporary folder, removed once it has read them).
  bool report_files = true;
  /// Whether the doctor prints its report at the end (false: a front end that returns
  /// it, as Python's Diagnosis does, so that it is not said twice).
  bool says_report = true;
  int64_t interrupt_at_step = -1;        ///< testing aid: raise SIGINT after this training step
  int64_t abort_at_step = -1;            ///< testing aid: the last rank aborts after this step
  int64_t inject_overflow_at_step = -1;  ///< testing aid: the last rank's gradients get an inf here
};

/// The defaults `command` starts from (doctor compares fp16 unless told otherwise).
RunArgs defaults_for(Command command);

/// How an option's value is written (on the command line, in args.json, in Python).
enum class ValueType {
  kSwitch,     ///< a flag without a value; true when given
  kInt,        ///< an integer
  kNumber,     ///< a real number
  kText,       ///< a string
  kLrs,        ///< a learning rate: a number, a list a,b or a slice lo:hi / :hi
  kList,       ///< names: comma-separated as text, a JSON array of strings in args.json
};

struct Option {
  std::string key;   ///< args.json's key, the Python keyword, OptionError's key
  std::string flag;  ///< "--init-scale" (empty: not a flag, e.g. ranks)
  ValueType type = ValueType::kText;
  unsigned commands = 0;  ///< the Commands that take it (bits)
  std::string help;       ///< as train says it
  std::vector<std::pair<Command, std::string>> help_for;  ///< another command's own words
  std::vector<Precision> modes;  ///< the precision modes it applies to (empty: every mode)
  std::string modes_note;        ///< why it does nothing elsewhere ("it sets fp16's GradScaler")
  bool stored = false;           ///< kept in args.json
  bool added_later = false;      ///< absent from the first release's args.json: its default applies
  bool hidden = false;           ///< a testing aid, left out of help
  bool show_default = true;      ///< help shows the default
  /// The names a choice takes (loss, thread_policy, comm_dtype), in help's order:
  /// set() refuses any other, naming these.
  std::vector<std::string> choices;
  /// The smallest value a number takes: validate() refuses less and help says it
  /// ("(>= 1)", "(> 0)"). Numbers must be finite besides.
  std::optional<double> min;
  bool min_excluded = false;     ///< min itself is refused ("> 0")
  /// A keyword argument of the Python functions. The model, the data and out are
  /// their arguments; resuming, rendezvous timeouts and gradient communication
  /// belong to the CLI's runs (mixtrain train --resume, mixtrain launch).
  bool keyword = true;
  /// The value as text (the CLI's and args.json's form: exact numbers, "true"/"false").
  std::function<std::string(const RunArgs&)> get;
  /// Sets it from text; throws OptionError naming the key for text that does not parse.
  std::function<void(RunArgs&, const std::string&)> set;

  bool takes(Command c) const { return (commands & static_cast<unsigned>(c)) != 0; }
  bool applies_to(Precision p) const;
  /// The help `command` shows, with the limit the row holds ("Batch size (>= 1)").
  std::string help_in(Command command) const;
  /// The limit as help says it (">= 1", "> 0"), or "" for none.
  std::string limit() const;
};

/// The table, in the order help lists the options.
const std::vector<Option>& options();
/// The option with this key, or nullptr.
const Option* find_option(const std::string& key);
/// The option with this flag ("--bs"), or nullptr.
const Option* find_flag(const std::string& flag);

/// Checks every option `command` uses; throws OptionError naming the first bad
/// one ("invalid bs 0: must be >= 1"). Checks files exist, not what they hold.
void validate(const RunArgs& args, Command command);

/// Whether the front end was given `o`: named in RunArgs::given, or set to other than its
/// default (`defaults`: defaults_for the command).
bool was_given(const Option& o, const RunArgs& a, const RunArgs& defaults);

/// One warning for each option in `given` (keys) that does nothing in the chosen
/// precision mode, and for more threads than `cores`, the CPUs this process may use
/// (CpuBudget::usable_cpus; 0: not checked).
std::vector<Phrase> ignored_option_warnings(const RunArgs& args, const std::vector<std::string>& given, int cores);

/// The CLI's words: "--init-scale 256", "--precision bf16", "--no-emulation".
const OptionWords& flag_words();
/// Python's words: "init_scale=256", "precision=\"bf16\"", "no_emulation=True".
const OptionWords& keyword_words();

/// A number as the table writes it: the shortest text that reads back exactly.
std::string format_number(double v);

} // namespace mixtrain::run
