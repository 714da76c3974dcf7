#include "mixtrain/run/options.h"
#include "mixtrain/core/precision_modes.h"

#include "util/comma_list.h"
#include "util/read_file.h"
#include "mixtrain/amp/mixed_precision.h"
#include "mixtrain/amp/loss_scale_rule.h"
#include "mixtrain/util/atomic_file.h"
#include "mixtrain/data/data.h"
#include "mixtrain/util/option_error.h"
#include "mixtrain/run/model_registry.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

namespace mixtrain::run {

namespace {

constexpr unsigned kT = static_cast<unsigned>(Command::kTrain);
constexpr unsigned kD = static_cast<unsigned>(Command::kDoctor);
constexpr unsigned kL = static_cast<unsigned>(Command::kLrFind);

/// What the doctor compares with fp32 when --precision is not given.
constexpr Precision kDoctorPrecision = Precision::kFp16;

// ---- Text <-> values: the one form the CLI, args.json and Python share --------

int64_t parse_int(const std::string& key, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
    throw OptionError(key, "'" + text + "'", "must be an integer");
  return v;
}

double parse_double(const std::string& key, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) throw OptionError(key, "'" + text + "'", "must be a number");
  return v;
}

bool parse_bool(const std::string& key, const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  throw OptionError(key, "'" + text + "'", "must be true or false");
}

std::string show_bool(bool v) { return v ? "true" : "false"; }

/// Builds one table row; the chained calls read like the row they describe.
struct Def {
  Option o;
  Def(std::string key, std::string flag, ValueType type, unsigned commands, std::string help) {
    o.key = std::move(key);
    o.flag = std::move(flag);
    o.type = type;
    o.commands = commands;
    o.help = std::move(help);
  }
  Def& stored() { return o.stored = true, *this; }
  Def& added_later() { return o.stored = o.added_later = true, *this; }
  Def& hidden() { return o.hidden = true, *this; }
  Def& no_default() { return o.show_default = false, *this; }
  Def& not_keyword() { return o.keyword = false, *this; }
  /// The smallest value it takes, and a bound it stays above.
  Def& at_least(double lo) { return o.min = lo, *this; }
  Def& above(double lo) { return o.min = lo, o.min_excluded = true, *this; }
  /// A choice among `names`, each standing for a value of the field `at` reaches.
  template <typename T, typename At>
  Def& choice(std::vector<std::pair<std::string, T>> names, At at) {
    std::string listed;
    for (const auto& n : names) {
      o.choices.push_back(n.first);
      listed += (listed.empty() ? "" : ", ") + n.first;
    }
    const std::string key = o.key;
    return access(
        [names, at](const RunArgs& a) {
          const T& v = at(const_cast<RunArgs&>(a));
          for (const auto& [name, value] : names)
            if (value == v) return name;
          TORCH_INTERNAL_ASSERT(false, "a value with no name in its option's choices");
          return std::string();
        },
        [names, at, key, listed](RunArgs& a, const std::string& text) {
          for (const auto& [name, value] : names)
            if (name == text) {
              at(a) = value;
              return;
            }
          throw OptionError(key, "unknown " + Phrase::name(key) + " '" + text + "' (choices: " + listed + ")");
        });
  }
  Def& in(Command c, std::string help) { return o.help_for.emplace_back(c, std::move(help)), *this; }
  Def& modes(std::vector<Precision> m, std::string note = "") {
    o.modes = std::move(m);
    o.modes_note = std::move(note);
    return *this;
  }
  Def& access(std::function<std::string(const RunArgs&)> get, std::function<void(RunArgs&, const std::string&)> set) {
    o.get = std::move(get);
    o.set = std::move(set);
    return *this;
  }
  /// A getter and a setter, as access() takes them.
  struct Access {
    std::function<std::string(const RunArgs&)> get;
    std::function<void(RunArgs&, const std::string&)> set;
  };
  Def& access(Access a) { return access(std::move(a.get), std::move(a.set)); }
  /// A field reached through `at` (a member of RunArgs or of its config).
  template <typename T, typename At>
  Def& field(At at) {
    const std::string key = o.key;
    if constexpr (std::is_same_v<T, std::string>) {
      return access([at](const RunArgs& a) { return at(const_cast<RunArgs&>(a)); },
                    [at](RunArgs& a, const std::string& t) { at(a) = t; });
    } else if constexpr (std::is_same_v<T, bool>) {
      return access([at](const RunArgs& a) { return show_bool(at(const_cast<RunArgs&>(a))); },
                    [at, key](RunArgs& a, const std::string& t) { at(a) = parse_bool(key, t); });
    } else if constexpr (std::is_floating_point_v<T>) {
      return access([at](const RunArgs& a) { return format_number(at(const_cast<RunArgs&>(a))); },
                    [at, key](RunArgs& a, const std::string& t) { at(a) = parse_double(key, t); });
    } else {
      return access([at](const RunArgs& a) { return std::to_string(at(const_cast<RunArgs&>(a))); },
                    [at, key](RunArgs& a, const std::string& t) {
                      const int64_t v = parse_int(key, t);
                      if constexpr (std::is_unsigned_v<T>) {
                        if (v < 0) throw OptionError(key, t, "must be >= 0");
                      }
                      if constexpr (sizeof(T) < sizeof(int64_t)) {
                        if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
                            v > static_cast<int64_t>(std::numeric_limits<T>::max()))
                          throw OptionError(key, t, "is out of range");
                      }
                      at(a) = static_cast<T>(v);
                    });
    }
  }
  operator Option() const { return o; }  // NOLINT
};

#define MIXTRAIN_CONFIG(member) [](RunArgs& a) -> auto& { return a.config.member; }
#define MIXTRAIN_ARGS(member) [](RunArgs& a) -> auto& { return a.member; }

std::vector<Option> make_table() {
  // The modes an option applies to, from the precision-mode table: fp16's GradScaler is
  // the scaler of the one loss-scaled mode without masters.
  std::vector<Precision> kScaler;
  for (const auto& m : precision_modes())
    if (m.scales_loss && !m.master_weights) kScaler.push_back(m.precision);
  const std::vector<Precision> kMaster = modes_where(&PrecisionMode::master_weights);
  const std::string models = builtin_model_list();
  std::string model_help = "Model: a TorchScript file (torch.jit.script(model).save(PATH)), or built-in";
  for (const auto& m : builtin_models()) model_help += " " + m.name + " (" + m.description + "),";
  model_help.back() = ' ';
  model_help.pop_back();
  std::vector<Option> t;
  auto add = [&t](Def d) { t.push_back(d); };

  add(Def("data", "--data", ValueType::kText, kT | kD | kL,
          "Fashion-MNIST's directory (four idx .gz files), or a .pt file written by Python's torch.save with 'x' (a "
          "tensor or a list of tensors), 'y' and optionally 'valid_x', 'valid_y'; for a text model (transformer) a text "
          "file or directory (default: the model's own data: Fashion-MNIST in " + std::string(data::kFashionMnistDir) +
              ", the transformer's corpus in " + data::kFortunesDir + ")")
          .stored().no_default().not_keyword().field<std::string>(MIXTRAIN_CONFIG(data)));
  add(Def("model", "--model", ValueType::kText, kT | kD | kL, model_help).stored().not_keyword().field<std::string>(MIXTRAIN_CONFIG(model)));
  add(Def("loss", "--loss", ValueType::kText, kT | kD | kL,
          "Loss: cross_entropy (classes; also [N, T, C] sequences), mse, bce_with_logits, or model: a TorchScript model "
          "that computes its loss takes the targets as its last input and returns it (a dict's 'loss', a scalar, or "
          "(loss, logits))")
          .added_later().choice(loss_names(), MIXTRAIN_CONFIG(loss)));
  add(Def("output", "--output", ValueType::kText, kT | kD | kL,
          "Which part of a TorchScript model's structured output is the prediction: a dict key or namedtuple field "
          "(logits), or a tuple index (1); default: a dict's 'logits', else the first tensor of a tuple or list")
          .added_later().no_default().field<std::string>(MIXTRAIN_CONFIG(output)));
  add(Def("epochs", "--epochs", ValueType::kInt, kT | kD, "Epochs to train")
          .in(Command::kDoctor, "Epochs each of the two runs trains")
          .stored().at_least(1).field<int64_t>(MIXTRAIN_CONFIG(epochs)));
  add(Def("lr", "--lr", ValueType::kLrs, kT | kD,
          "Peak learning rate of the one-cycle schedule (> 0); with --split-at one per parameter group (1e-4,1e-3) or "
          "fastai's slice: LO:HI spreads them geometrically, :HI gives HI/10 to all but the last group")
          .in(Command::kDoctor, "Peak learning rate of the one-cycle schedule (> 0), the same for both runs")
          .stored()
          .access([](const RunArgs& a) { return a.config.lr.str(); },
                  [](RunArgs& a, const std::string& t) { a.config.lr = Lrs::parse(t); }));
  add(Def("bs", "--bs", ValueType::kInt, kT | kD | kL, "Batch size").stored().at_least(1).field<int64_t>(MIXTRAIN_CONFIG(bs)));
  add(Def("seed", "--seed", ValueType::kInt, kT | kD | kL,
          "Seed for weights and data order (0 to 2^63-1); same seed + threads = same result")
          .stored()
          .access([](const RunArgs& a) { return std::to_string(a.config.seed); },
                  [](RunArgs& a, const std::string& t) {
                    // The range the help gives: torch's generators take a uint64, but the seed
                    // also travels as a signed 64-bit number (summary.json, Python), where 2^63
                    // and above would wrap to a negative seed.
                    if (!t.empty() && t[0] == '-') throw OptionError("seed", t, "must be >= 0");
                    errno = 0;
                    char* end = nullptr;
                    const unsigned long long v = std::strtoull(t.c_str(), &end, 10);
                    if (t.empty() || end != t.c_str() + t.size() || (errno == ERANGE && v != ULLONG_MAX))
                      throw OptionError("seed", "'" + t + "'", "must be an integer");
                    if (errno == ERANGE || v > static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()))
                      throw OptionError("seed", t, "must be at most 2^63-1 (9223372036854775807)");
                    a.config.seed = v;
                  }));
  add(Def("limit", "--limit", ValueType::kInt, kT | kD | kL,
          "Train on the first N training samples only (>= 1; default, or -1: all)")
          .stored().no_default().field<int64_t>(MIXTRAIN_CONFIG(limit)));
  add(Def("threads", "--threads", ValueType::kInt, kT | kD | kL,
          "Threads in all, placed as --thread-policy says (0: the physical cores this process may use, by its CPU "
          "affinity and cgroup quota; OMP_NUM_THREADS when set)")
          .stored().at_least(0).field<int>(MIXTRAIN_CONFIG(threads)));
  add(Def("thread_policy", "--thread-policy", ValueType::kText, kT | kD | kL,
          "Where the threads go: intra_op (libtorch's OpenMP pool, OpenBLAS at 1: conv nets), blas (OpenBLAS, "
          "libtorch at 1: models dominated by large matrix products), auto (the built-in model's choice; intra_op "
          "for TorchScript models)")
          .added_later()
          .choice(std::vector<std::pair<std::string, std::optional<ThreadPolicy>>>{
                      {"auto", std::nullopt}, {"intra_op", ThreadPolicy::kIntraOp}, {"blas", ThreadPolicy::kBlas}},
                  MIXTRAIN_CONFIG(thread_policy)));
  add(Def("precision", "--precision", ValueType::kText, kT | kD | kL,
          "Training precision: " + mode_summaries())
          .in(Command::kDoctor, "The precision compared with fp32: " +
                                    mode_names(modes_where(&PrecisionMode::doctor_compares), " or ", kDoctorPrecision))
          .in(Command::kLrFind, "Precision of the sweep: " + mode_names(all_precisions(), ", ", Precision::kFp32))
          .stored()
          .access([](const RunArgs& a) { return precision_name(a.config.precision); },
                  [](RunArgs& a, const std::string& t) { a.config.precision = parse_precision(t); }));
  const std::string scaler_note = "it sets fp16's GradScaler";
  add(Def("init_scale", "--init-scale", ValueType::kNumber, kT | kD | kL, "fp16: initial loss scale")
          .stored().modes(kScaler, scaler_note)
          .field<double>([](RunArgs& a) -> double& { return a.config.precision_options.scaler().init_scale(); }));
  add(Def("growth_factor", "--growth-factor", ValueType::kNumber, kT | kD | kL,
          "fp16: scale multiplier after growth-interval clean steps")
          .stored().modes(kScaler, scaler_note)
          .field<double>([](RunArgs& a) -> double& { return a.config.precision_options.scaler().growth_factor(); }));
  add(Def("backoff_factor", "--backoff-factor", ValueType::kNumber, kT | kD | kL,
          "fp16: scale multiplier on overflow")
          .stored().modes(kScaler, scaler_note)
          .field<double>([](RunArgs& a) -> double& { return a.config.precision_options.scaler().backoff_factor(); }));
  add(Def("growth_interval", "--growth-interval", ValueType::kInt, kT | kD | kL,
          "fp16: clean steps before the scale grows")
          .stored().modes(kScaler, scaler_note)
          .field<int64_t>([](RunArgs& a) -> int64_t& { return a.config.precision_options.scaler().growth_interval(); }));
  add(Def("no_emulation", "--no-emulation", ValueType::kSwitch, kT | kD | kL,
          "fp16 on CPU: fail instead of emulating fp16 numerics (emulation checks fp16 safety; no speed-up)")
          .stored().no_default().modes(kScaler)
          .access([](const RunArgs& a) { return show_bool(!a.config.precision_options.allow_fp16_emulation()); },
                  [](RunArgs& a, const std::string& t) {
                    a.config.precision_options.allow_fp16_emulation(!parse_bool("no_emulation", t));
                  }));
  add(Def("keep_fp32", "--keep-fp32", ValueType::kList, kT | kD | kL,
          "Modules kept in fp32 under fp16/bf16 (comma-separated module paths or patterns such as "
          "encoder.layers.*.mlp): every op inside them, parameter-free ones included, computes in fp32")
          .added_later().no_default().modes(modes_where(&PrecisionMode::takes_islands), "the whole model is fp32")
          .access([](const RunArgs& a) { return detail::comma_joined(a.config.precision_options.keep_fp32()); },
                  [](RunArgs& a, const std::string& t) {
                    const std::vector<std::string> names = detail::comma_list(t);
                    if (std::find(names.begin(), names.end(), "") != names.end())
                      throw OptionError("keep_fp32", "an empty module name in " + Phrase::setting("keep_fp32", "'" + t + "'") +
                                                         " (takes module paths separated by commas, e.g. conv_proj,encoder.layers.*.mlp)");
                    a.config.precision_options.keep_fp32(names);
                  }));
  add(Def("weight_update", "--weight-update", ValueType::kText, kT | kD | kL,
          "bf16-pure: how a bf16 weight takes its fp32 update: nearest (plain bf16: updates below half a unit in the "
          "last place are lost), stochastic (rounded up or down in proportion, seeded by --seed; no extra memory), "
          "kahan (a bf16 compensation carries what rounding dropped; 2 bytes per parameter)")
          .added_later()  // no modes: another mode's stochastic or kahan is an error (validate_precision), not a warning
          .choice(amp::weight_update_names(),
                  [](RunArgs& a) -> amp::WeightUpdate& { return a.config.precision_options.weight_update(); }));
  const std::string master_note = "it sets fp16-master/bf16-master";
  add(Def("loss_scale", "--loss-scale", ValueType::kNumber, kT | kL,
          "fp16-master/bf16-master: a static loss scale X (0: dynamic, starting at " +
              format_number(amp::kDefaultInitScale) + ")")
          .stored().no_default().modes(kMaster, master_note)
          .access([](const RunArgs& a) { return format_number(const_cast<RunArgs&>(a).config.precision_options.master().loss_scale()); },
                  [](RunArgs& a, const std::string& t) {
                    const double v = parse_double("loss_scale", t);
                    auto& m = a.config.precision_options.master();
                    m.loss_scale(v);
                    if (v > 0) m.dynamic(false);  // a given scale is static; args.json's "dynamic" follows and says so too
                  }));
  add(Def("dynamic", "", ValueType::kSwitch, 0, "fp16-master/bf16-master: dynamic loss scaling")
          .stored().field<bool>([](RunArgs& a) -> bool& { return a.config.precision_options.master().dynamic(); }));
  add(Def("max_noskip", "--max-noskip", ValueType::kInt, kT | kL,
          "fp16-master/bf16-master: clean steps before the scale doubles")
          .stored().modes(kMaster, master_note)
          .field<int64_t>([](RunArgs& a) -> int64_t& { return a.config.precision_options.master().max_noskip(); }));
  add(Def("max_scale", "--max-scale", ValueType::kNumber, kT | kL,
          "fp16-master/bf16-master: the scale never grows past X")
          .stored().modes(kMaster, master_note)
          .field<double>([](RunArgs& a) -> double& { return a.config.precision_options.master().max_scale(); }));
  add(Def("flat_master", "--flat-master", ValueType::kSwitch, kT | kL,
          "fp16-master/bf16-master: one contiguous fp32 master buffer per param group")
          .stored().no_default().modes(kMaster, master_note)
          .field<bool>([](RunArgs& a) -> bool& { return a.config.precision_options.master().flat_master(); }));
  add(Def("clip", "--clip", ValueType::kNumber, kT | kD | kL, "Clip the global gradient norm to X (after unscaling; default: off)")
          .stored().no_default().at_least(0).field<double>(MIXTRAIN_CONFIG(clip)));
  add(Def("accum", "--accum", ValueType::kInt, kT | kD | kL, "Accumulate gradients over N batches per optimizer step")
          .stored().at_least(1).field<int64_t>(MIXTRAIN_CONFIG(accum)));
  // The optimizer (core/optimizers.h): its kind and fastai's knobs. A knob left unset takes
  // the kind's default; what the table reads back (help, args.json) is the value in use.
  std::vector<std::pair<std::string, OptimizerKind>> kinds;
  for (OptimizerKind k : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd, OptimizerKind::kRmsprop,
                          OptimizerKind::kAdagrad})
    kinds.emplace_back(optimizer_name(k), k);
  add(Def("opt", "--opt", ValueType::kText, kT | kD | kL,
          "Optimizer: adamw (fastai's default), adam, sgd, rmsprop or adagrad, with fastai's defaults for each")
          .added_later().choice(kinds, [](RunArgs& a) -> OptimizerKind& { return a.config.opt.kind(); }));
  using Field = double& (*)(OptimizerSettings&);
  const auto knob = [](const char* key, Field field, double lo, bool lo_excluded, double hi) {
    return Def::Access{
        [field](const RunArgs& a) {
          OptimizerSettings in_use = a.config.opt.resolved();
          return format_number(field(in_use));
        },
        [key, field, lo, lo_excluded, hi](RunArgs& a, const std::string& t) {
          const double v = parse_double(key, t);
          if (!std::isfinite(v)) throw OptionError(key, t, "must be a finite number");
          if (v < lo || (lo_excluded && v == lo) || v >= hi)
            throw OptionError(key, t, std::string("must be ") + (lo_excluded ? "> " : ">= ") + format_number(lo) +
                                          (std::isinf(hi) ? std::string() : " and < " + format_number(hi)));
          field(a.config.opt) = v;
        }};
  };
  const double inf = std::numeric_limits<double>::infinity();
  add(Def("mom", "--mom", ValueType::kNumber, kT | kD | kL,
          "Momentum: Adam's beta1, SGD's and RMSprop's momentum (default: 0.9 for adamw/adam, 0 for sgd/rmsprop; "
          "fit_one_cycle cycles it 0.95 -> 0.85 -> 0.95)")
          .added_later().no_default().access(knob("mom", [](OptimizerSettings& o) -> double& { return o.mom(); }, 0, false, 1)));
  add(Def("sqr_mom", "--sqr-mom", ValueType::kNumber, kT | kD | kL,
          "The squared gradients' moving average: Adam's beta2, RMSprop's alpha (default: 0.99)")
          .added_later().no_default().access(knob("sqr_mom", [](OptimizerSettings& o) -> double& { return o.sqr_mom(); }, 0, false, 1)));
  add(Def("eps", "--eps", ValueType::kNumber, kT | kD | kL,
          "The optimizer's epsilon (default: 1e-5 for adamw/adam, 1e-8 for rmsprop, 1e-10 for adagrad)")
          .added_later().no_default().access(knob("eps", [](OptimizerSettings& o) -> double& { return o.eps(); }, 0, true, inf)));
  add(Def("wd", "--wd", ValueType::kNumber, kT | kD | kL,
          "Weight decay: decoupled for adamw, added to the gradient for the others (default: 0.01 for adamw/adam, 0 "
          "for the others)")
          .added_later().no_default().access(knob("wd", [](OptimizerSettings& o) -> double& { return o.wd(); }, 0, false, inf)));
  add(Def("wd_bn_bias", "--wd-bn-bias", ValueType::kSwitch, kT | kD | kL,
          "Apply weight decay to norm layers' parameters and biases too (fastai's wd_bn_bias; default: not)")
          .added_later().no_default().field<bool>(MIXTRAIN_CONFIG(wd_bn_bias)));
  add(Def("split_at", "--split-at", ValueType::kText, kT,
          "Parameter groups: a new group starts at each named layer (comma-separated parameter-name prefixes in model "
          "order, e.g. head or 4,8); each group gets its own --lr")
          .added_later().no_default().field<std::string>(MIXTRAIN_CONFIG(split_at)));
  add(Def("freeze_to", "--freeze-to", ValueType::kInt, kT,
          "Train only parameter groups N and after (with --split-at; norm layers still train, as fastai)")
          .added_later().field<int64_t>(MIXTRAIN_CONFIG(freeze_to)));
  add(Def("save_best", "--save-best", ValueType::kSwitch, kT,
          "Keep the model of the best epoch (by --monitor) and end the run with it (OUT/model.pt is the best)")
          .added_later().no_default().field<bool>(MIXTRAIN_CONFIG(save_best)));
  add(Def("early_stop", "--early-stop", ValueType::kInt, kT,
          "Stop once PATIENCE epochs in a row brought no improvement in --monitor (fastai's EarlyStopping)")
          .added_later().no_default().field<int64_t>(MIXTRAIN_CONFIG(early_stop)));
  add(Def("monitor", "--monitor", ValueType::kText, kT,
          "What --save-best and --early-stop follow: valid_loss, train_loss, or a metric (accuracy, perplexity)")
          .added_later().field<std::string>(MIXTRAIN_CONFIG(monitor)));
  add(Def("save_every", "--save-every", ValueType::kInt, kT,
          "Save a checkpoint every N epochs and after the last (0: only on Ctrl-C)")
          .stored().at_least(0).field<int64_t>(MIXTRAIN_CONFIG(save_every)));
  add(Def("save_every_steps", "--save-every-steps", ValueType::kInt, kT,
          "Also save a checkpoint every N training steps (0: none), to resume or branch a long run from "
          "(mixtrain doctor --from); --keep counts these too")
          .added_later().at_least(0).field<int64_t>(MIXTRAIN_CONFIG(save_every_steps)));
  add(Def("keep", "--keep", ValueType::kInt, kT, "Keep only the newest K checkpoints (0: all)")
          .stored().at_least(0).field<int64_t>(MIXTRAIN_CONFIG(keep)));
  add(Def("max_bad_steps", "--max-bad-steps", ValueType::kInt, kT,
          "With loss scaling (fp16, *-master): stop after more than N consecutive NaN/inf losses (fp32/bf16 stop at "
          "the first)")
          .stored().at_least(0).field<int64_t>(MIXTRAIN_CONFIG(max_bad_steps)));
  add(Def("comm_dtype", "--comm-dtype", ValueType::kText, kT,
          "Data parallel (under mixtrain launch / torchrun): dtype gradients travel in, fp32 or fp16 (half the traffic)")
          .stored().not_keyword()
          .choice(std::vector<std::pair<std::string, c10::ScalarType>>{{"fp32", c10::ScalarType::Float},
                                                                       {"fp16", c10::ScalarType::Half}},
                  MIXTRAIN_CONFIG(comm_dtype)));
  add(Def("ranks", "", ValueType::kInt, 0, "Data-parallel ranks the run was trained by")
          .added_later().field<int>(MIXTRAIN_CONFIG(ranks)));
  add(Def("out", "--out", ValueType::kText, kT | kD | kL,
          "Run directory for metrics.csv, steps.csv, summary.json, checkpoints, model.pt and the charts (default: "
          "runs/<timestamp>)")
          .in(Command::kDoctor, "Directory for diagnosis.json, loss.svg and scale.svg (default: runs/doctor-<timestamp>)")
          .in(Command::kLrFind, "Directory for lr_find.svg and lr_find.csv (default: runs/lr_find-<timestamp>)")
          .no_default().not_keyword()
          .access([](const RunArgs& a) { return a.out; },
                  [](RunArgs& a, const std::string& t) {
                    // Not the default folder in disguise: an empty name is a mistake (an unset shell variable).
                    if (t.empty()) throw OptionError("out", "an empty " + Phrase::name("out") + ": name a folder, or leave it out for runs/<timestamp>");
                    a.out = t;
                  }));
  add(Def("resume", "--resume", ValueType::kText, kT,
          "Continue the run in OUT_DIR from its newest complete checkpoint, with the run's own flags (OUT_DIR/args.json)")
          .no_default().not_keyword()
          .access([](const RunArgs& a) { return a.resume; },
                  [](RunArgs& a, const std::string& t) {
                    if (t.empty()) throw OptionError("resume", "an empty " + Phrase::name("resume") + ": name the run folder to continue");
                    a.resume = t;
                  }));
  add(Def("force", "--force", ValueType::kSwitch, kT, "Start a new run in an --out directory that already holds checkpoints (the old run's checkpoints are removed)")
          .no_default().field<bool>(MIXTRAIN_ARGS(force)));
  add(Def("timeout", "--timeout", ValueType::kNumber, kT,
          "Data parallel: seconds to wait for the other ranks, at the rendezvous and in every collective")
          .above(0).not_keyword().field<double>(MIXTRAIN_ARGS(timeout)));
  add(Def("start_lr", "--start-lr", ValueType::kNumber, kL, "First learning rate of the sweep")
          .above(0).field<double>([](RunArgs& a) -> double& { return a.lr_find.start_lr(); }));
  add(Def("end_lr", "--end-lr", ValueType::kNumber, kL, "Last learning rate of the sweep")
          .field<double>([](RunArgs& a) -> double& { return a.lr_find.end_lr(); }));
  add(Def("num_it", "--num-it", ValueType::kInt, kL, "Steps of the sweep")
          .at_least(LrFindOptions::kMinSteps).field<int64_t>([](RunArgs& a) -> int64_t& { return a.lr_find.num_it(); }));
  add(Def("max_trials", "--max-trials", ValueType::kInt, kD,
          "After a problem verdict, try at most N candidate fixes, each one more mixed run from the same weights, seed "
          "and data order, and name the best proven one")
          .at_least(0).field<int64_t>(MIXTRAIN_ARGS(max_trials)));
  add(Def("no_trials", "--no-trials", ValueType::kSwitch, kD, "Try no fixes: the verdict and its fixes only")
          .no_default().field<bool>(MIXTRAIN_ARGS(no_trials)));
  add(Def("head_start", "--head-start", ValueType::kSwitch, kD,
          "Start the likely first trial (stochastic rounding, for a bf16-pure run losing its updates) on the fp32 "
          "baseline's thread once it ends, before the verdict: faster, but the trial's numbers then depend on when "
          "the run ended (not bitwise the same from one doctor to the next)")
          .no_default().field<bool>(MIXTRAIN_ARGS(head_start)));
  add(Def("from_run", "--from", ValueType::kText, kT | kD,
          "Start a new run (in --out) from RUN_DIR's checkpoint with the rest of its schedule; the run's own flags, "
          "changed only in how it computes (precision and its options, clipping, threads, checkpoints)")
          .in(Command::kDoctor, "Diagnose a run from its own checkpoint: replay a window of its training in fp32 and "
                                "in its precision (RUN_DIR holds args.json and checkpoints; the run's flags are its own)")
          .no_default().not_keyword().field<std::string>(MIXTRAIN_ARGS(from_run)));
  add(Def("at", "--at", ValueType::kInt, kT | kD, "With --from: start from the checkpoint of this training step (default: the newest)")
          .in(Command::kDoctor, "With --from: branch from the checkpoint of this training step (default: the newest "
                                "the run went on from for a whole window; for a run that went wrong, the newest before its first NaN/inf loss, "
                                "else the state it stopped in)")
          .no_default().not_keyword().field<int64_t>(MIXTRAIN_ARGS(at)));  // -1: chosen; checked by doctor_from
  add(Def("window", "--window", ValueType::kInt, kD,
          "With --from: training steps replayed in each arm (default: 100, or what the run has left; at least 8)")
          .no_default().not_keyword().field<int64_t>(MIXTRAIN_ARGS(window)));  // -1: the default; checked by doctor_from
  // Testing aids (mixtrain/callbacks/fault_injection.h), hidden from help.
  add(Def("interrupt_at_step", "--interrupt-at-step", ValueType::kInt, kT, "").hidden().field<int64_t>(MIXTRAIN_ARGS(interrupt_at_step)));
  add(Def("abort_at_step", "--abort-at-step", ValueType::kInt, kT, "").hidden().field<int64_t>(MIXTRAIN_ARGS(abort_at_step)));
  add(Def("inject_overflow_at_step", "--inject-overflow-at-step", ValueType::kInt, kT, "")
          .hidden().field<int64_t>(MIXTRAIN_ARGS(inject_overflow_at_step)));
  return t;
}

#undef MIXTRAIN_CONFIG
#undef MIXTRAIN_ARGS


} // namespace

const char* command_name(Command command) {
  switch (command) {
    case Command::kTrain: return "train";
    case Command::kDoctor: return "doctor";
    case Command::kLrFind: return "lr_find";
  }
  return "?";
}

RunArgs defaults_for(Command command) {
  RunArgs a;
  if (command == Command::kDoctor) a.config.precision = kDoctorPrecision;
  return a;
}

bool Option::applies_to(Precision p) const { return modes.empty() || std::find(modes.begin(), modes.end(), p) != modes.end(); }

std::string Option::limit() const {
  if (!min) return "";
  return (min_excluded ? "> " : ">= ") + format_number(*min);
}

std::string Option::help_in(Command command) const {
  std::string text = help;
  for (const auto& [c, own] : help_for)
    if (c == command) text = own;
  return min ? text + " (" + limit() + ")" : text;
}

const std::vector<Option>& options() {
  static const std::vector<Option> kTable = make_table();
  return kTable;
}

const Option* find_option(const std::string& key) {
  for (const auto& o : options())
    if (o.key == key) return &o;
  return nullptr;
}

const Option* find_flag(const std::string& flag) {
  for (const auto& o : options())
    if (!o.flag.empty() && o.flag == flag) return &o;
  return nullptr;
}

std::string format_number(double v) {
  char buf[40];
  // From 6 digits (10, not 1e+01), up to the 17 that always read back exactly.
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v || std::isnan(v)) return buf;
  }
  return buf;
}

void validate(const RunArgs& args, Command command) {
  namespace fs = std::filesystem;
  const RunConfig& r = args.config;
  const bool train = command == Command::kTrain;
  if (train && r.split_at.empty() && r.freeze_to != 0)
    throw OptionError("freeze_to", Phrase::setting("freeze_to", std::to_string(r.freeze_to)) +
                                       " needs parameter groups: name where they start with " + Phrase::name("split_at"));
  // The table's limits, and finite numbers, for every option the command takes, in
  // every mode: a value another mode ignores is still stored in args.json, and a
  // NaN there (JSON null) would make the run impossible to resume.
  for (const Option& o : options()) {
    if (!o.takes(command)) continue;
    if (o.type != ValueType::kInt && o.type != ValueType::kNumber) continue;
    const std::string text = o.get(args);
    const double v = std::strtod(text.c_str(), nullptr);
    if (o.type == ValueType::kNumber) {
      check_option(std::isfinite(v), o.key, text, "must be a finite number");
      // Scales, factors and clip norms become fp32 tensors: a value past fp32's range is inf there.
      check_option(std::fabs(v) <= std::numeric_limits<float>::max(), o.key, text, "must be at most 3.4e38 (fp32's largest)");
    }
    if (o.min) check_option(o.min_excluded ? v > *o.min : v >= *o.min, o.key, text, "must be " + o.limit());
  }
  check_option(r.limit == -1 || r.limit >= 1, "limit", r.limit, "must be >= 1");
  if (!args.model_source && !find_builtin_model(r.model) && !fs::is_regular_file(r.model))
    throw OptionError("model", "unknown " + Phrase::name("model") + " '" + r.model + "': not a built-in model (" +
                                   builtin_model_list() + ") " + (fs::exists(r.model) ? "and not a file" : "and no such file"));
  if (train) check_option(r.early_stop >= -1, "early_stop", r.early_stop, "must be >= 0");
  if (command == Command::kLrFind) validate(args.lr_find);  // the sweep's own checks, with their keys
  // The library's own option checks (OptionError with the option's key).
  validate_precision(r.precision, r.precision_options, torch::kCPU);
  // Training on a CPU: fp16 there is emulated, or an error with no_emulation. For
  // the doctor that is a verdict, not an error.
  if (command != Command::kDoctor && mode_of(r.precision).autocast)
    amp::check_precision_supported(compute_dtype(r.precision), torch::kCPU, r.precision_options.allow_fp16_emulation(),
                                   /*notice=*/false);  // the fit says it, once it runs
  if (!args.data_source && !r.data.empty() && !fs::exists(r.data))
    throw OptionError("data", Phrase::name("data") + " " + r.data + " not found");
}

bool was_given(const Option& o, const RunArgs& a, const RunArgs& defaults) {
  return std::find(a.given.begin(), a.given.end(), o.key) != a.given.end() || o.get(a) != o.get(defaults);
}

std::vector<Phrase> ignored_option_warnings(const RunArgs& args, const std::vector<std::string>& given, int cores) {
  std::vector<Phrase> out;
  const Precision p = args.config.precision;
  for (const auto& key : given) {
    const Option* o = find_option(key);
    if (!o || o->applies_to(p)) continue;
    out.push_back(Phrase::name(key) + " does nothing with " + Phrase::setting("precision", precision_name(p)) +
                  (o->modes_note.empty() ? "" : " (" + o->modes_note + ")"));
  }
  if (cores > 0 && args.config.threads > cores)
    out.push_back(Phrase::setting("threads", std::to_string(args.config.threads)) + " is more than the " +
                  std::to_string(cores) + " CPU(s) this process may use: threads will oversubscribe them");
  return out;
}

const OptionWords& flag_words() {
  static const OptionWords kWords{
      [](const std::string& key) {
        const Option* o = find_option(key);
        return o && !o->flag.empty() ? o->flag : key;
      },
      [](const std::string& key, const std::string& value) {
        const Option* o = find_option(key);
        if (!o || o->flag.empty()) return key + " " + value;
        if (o->type == ValueType::kSwitch) return value == "true" ? o->flag : "drop " + o->flag;
        return o->flag + " " + value;
      },
      "`mixtrain doctor`"};
  return kWords;
}

const OptionWords& keyword_words() {
  static const OptionWords kWords{[](const std::string& key) { return key; },
                                  [](const std::string& key, const std::string& value) {
                                    const Option* o = find_option(key);
                                    const ValueType type = o ? o->type : ValueType::kText;
                                    if (type == ValueType::kSwitch) return key + "=" + (value == "true" ? "True" : "False");
                                    if (type == ValueType::kText) return key + "=\"" + value + "\"";
                                    if (type == ValueType::kList) return key + "=[" + detail::quoted_list(value) + "]";
                                    return key + "=" + value;
                                  },
                                  "`mixtrain.doctor()`"};
  return kWords;
}

} // namespace mixtrain::run
