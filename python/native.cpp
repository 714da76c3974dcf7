// The Python front door's native half: the run layer (mixtrain/run/commands.h)
// on the caller's own TorchScript module and tensors, with no files and no
// copies. The Python half (mixtrain/__init__.py) scripts or traces an eager
// module, turns keyword arguments into the option table's text and wraps the
// results; what is here is what needs C++: the handover, the GIL, Ctrl-C, and
// errors as Python exceptions.
#include <torch/extension.h>

#include <pybind11/iostream.h>
#include <pybind11/stl.h>

#include <mixtrain/callbacks/stop_on_request.h>
#include <mixtrain/data/data.h>
#include <mixtrain/util/option_error.h>
#include <mixtrain/util/warnings.h>
#include <mixtrain/run/loop_state.h>
#include <mixtrain/run/stored_model.h>
#include <mixtrain/run/run_folder.h>
#include <mixtrain/run/commands.h>
#include <mixtrain/run/doctor.h>
#include <mixtrain/models/failure_site.h>
#include <mixtrain/models/scripted_model.h>
#include <mixtrain/optim/update_rule.h>
#include <mixtrain/diagnose/compare.h>
#include <mixtrain/diagnose/diagnosis.h>
#include <mixtrain/diagnose/plots.h>
#include <mixtrain/diagnose/watch.h>

#include <atomic>
#include <csignal>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;
namespace run = mixtrain::run;
namespace diagnose = mixtrain::diagnose;

namespace {

// ---- Ctrl-C: Python's own handler runs only between bytecodes, so while a run
// is in flight (GIL released) SIGINT sets the run's stop flag instead.
std::atomic<bool> g_stop_requested{false};

extern "C" void on_sigint(int) { g_stop_requested = true; }

class SigintStopsTheRun {
 public:
  SigintStopsTheRun() {
    g_stop_requested = false;
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    installed_ = ::sigaction(SIGINT, &sa, &previous_) == 0;
  }
  ~SigintStopsTheRun() {
    if (installed_) ::sigaction(SIGINT, &previous_, nullptr);
  }
  SigintStopsTheRun(const SigintStopsTheRun&) = delete;
  SigintStopsTheRun& operator=(const SigintStopsTheRun&) = delete;

 private:
  struct sigaction previous_ {};
  bool installed_ = false;
};

struct KeyboardInterrupt {};  // thrown with the GIL released, raised as Python's once it is back

run::Command command_of(const std::string& name) {
  for (run::Command c : {run::Command::kTrain, run::Command::kDoctor, run::Command::kLrFind})
    if (name == run::command_name(c)) return c;
  throw py::value_error("unknown command '" + name + "' (train, doctor, lr_find)");
}

const char* type_name(run::ValueType t) {
  switch (t) {
    case run::ValueType::kSwitch: return "switch";
    case run::ValueType::kInt: return "int";
    case run::ValueType::kNumber: return "number";
    case run::ValueType::kText: return "text";
    case run::ValueType::kLrs: return "lrs";
    case run::ValueType::kList: return "list";
  }
  return "text";
}

/// The keyword arguments `command` takes: the option table's rows as Python sees them.
py::list options(const std::string& command) {
  const run::Command c = command_of(command);
  const run::RunArgs defaults = run::defaults_for(c);
  py::list out;
  for (const run::Option& o : run::options()) {
    if (!o.takes(c) || o.hidden || o.flag.empty() || !o.keyword) continue;
    py::dict row;
    row["key"] = o.key;
    row["type"] = type_name(o.type);
    row["default"] = o.get(defaults);
    row["help"] = o.help_in(c);
    row["choices"] = o.choices;
    out.append(row);
  }
  return out;
}

/// A history value as Python shows it: counts as int, the rest as float.
py::object number(const std::string& column, double v) {
  static const std::set<std::string> kCounts{"iter", "epoch", "skipped", "samples", "steps"};
  if (kCounts.count(column) && std::isfinite(v)) return py::int_(static_cast<int64_t>(v));
  return py::float_(v);
}

/// A deep copy of `script` whose parameters are leaves, as the originals are
/// (a clone under autograd would make them outputs of clone, which no optimizer takes).
torch::jit::Module copy_of(const torch::jit::Module& script) {
  torch::jit::Module copy;
  {
    torch::NoGradGuard no_grad;
    copy = script.clone();
  }
  const auto originals = script.named_parameters();
  auto o = originals.begin();
  // clone() copies each parameter slot on its own: a tensor two modules share (tied weights,
  // a language model's embedding and head) would come back as two, trained apart. Each slot
  // that shares an earlier one's tensor in the original gets the copy's tensor of that slot.
  std::unordered_map<const void*, at::Tensor> copied;  // the original's tensor -> the copy's
  for (const auto& p : copy.named_parameters()) {
    p.value.requires_grad_((*o).value.requires_grad());
    const auto [first, inserted] = copied.emplace((*o).value.unsafeGetTensorImpl(), p.value);
    if (!inserted && first->second.unsafeGetTensorImpl() != p.value.unsafeGetTensorImpl()) {
      torch::jit::Module owner = copy;
      std::string name = p.name;
      for (size_t dot; (dot = name.find('.')) != std::string::npos; name = name.substr(dot + 1))
        owner = owner.attr(name.substr(0, dot)).toModule();
      owner.setattr(name, first->second);
    }
    ++o;
  }
  return copy;
}

/// The training loop's optimizer as the Python half hands it over: {"optimizer": "adamw",
/// "groups": [{"params": [names], "lr": ..., ...}], "state": {name: {key: tensor}}}.
std::shared_ptr<const run::LoopState> loop_state(const py::dict& d) {
  auto loop = std::make_shared<run::LoopState>();
  loop->optimizer = d["optimizer"].cast<std::string>();
  for (const auto& item : d["groups"].cast<py::list>()) {
    const auto g = item.cast<py::dict>();
    run::LoopState::Group group;
    group.params = g["params"].cast<std::vector<std::string>>();
    group.lr = g["lr"].cast<double>();
    group.weight_decay = g["weight_decay"].cast<double>();
    group.eps = g["eps"].cast<double>();
    group.beta1 = g["beta1"].cast<double>();
    group.beta2 = g["beta2"].cast<double>();
    group.momentum = g["momentum"].cast<double>();
    group.dampening = g["dampening"].cast<double>();
    group.nesterov = g["nesterov"].cast<bool>();
    group.amsgrad = g["amsgrad"].cast<bool>();
    group.alpha = g["alpha"].cast<double>();
    group.centered = g["centered"].cast<bool>();
    group.lr_decay = g["lr_decay"].cast<double>();
    group.initial_accumulator_value = g["initial_accumulator_value"].cast<double>();
    loop->groups.push_back(std::move(group));
  }
  loop->state = d["state"].cast<std::map<std::string, std::map<std::string, at::Tensor>>>();
  if (d.contains("rounding_seed")) loop->rounding_seed = d["rounding_seed"].cast<uint64_t>();
  return loop;
}

/// One run of `command` on the caller's module (torch._C.ScriptModule) and tensors.
/// `settings` are keyword arguments as the table's text; `out` the run folder
/// (the Python half passes a temporary one when the caller gave none, and
/// `keep_files` false: the run does not name files that will be gone).
py::dict run_command(const std::string& command, const py::object& script_object, const std::string& model_name,
                     const std::vector<at::Tensor>& x, const at::Tensor& y, const std::vector<at::Tensor>& valid_x,
                     const c10::optional<at::Tensor>& valid_y, const std::map<std::string, std::string>& settings,
                     const std::string& out, bool keep_files, const py::object& loop) {
  const run::Command c = command_of(command);
  run::RunArgs args = run::defaults_for(c);
  for (const auto& [key, text] : settings) {
    const run::Option* o = run::find_option(key);
    // doctor(from_run=, at=, window=) are the Python half's own keywords (the table keeps them off
    // every command's signature: train --from needs a folder of its own, which Python's train has not).
    const bool branch_key = c == run::Command::kDoctor && (key == "from_run" || key == "at" || key == "window");
    if (!o || !o->takes(c) || o->hidden || (!o->keyword && !branch_key))
      throw py::type_error(std::string(run::command_name(c)) + "() got an unexpected keyword argument '" + key + "'");
    o->set(args, text);  // an OptionError: ValueError, in Python's words
    args.given.push_back(key);  // given, even at its default: doctor(from_run=) refuses it then too
  }
  args.out = out;
  args.report_files = keep_files;
  args.says_report = false;  // the Diagnosis returned says it (a notebook shows it once)
  if (!loop.is_none()) args.loop = loop_state(loop.cast<py::dict>());
  const bool has_model = !script_object.is_none();  // None: doctor(from_run=) of a run the CLI trained
  if (args.from_run.empty()) {
    args.config.model = model_name;  // reports name it; the model itself comes from model_source
    args.config.data = "";
  }
  if (has_model) {
    try {
      args.data_source = std::make_shared<const mixtrain::data::DatasetSplit>(mixtrain::data::tensor_split(
          x, y, valid_x, valid_y ? *valid_y : at::Tensor(), args.config.seed, "data", "pass more, or valid=(x, y)"));
    } catch (const c10::Error& e) {
      throw py::value_error(mixtrain::innermost_message(e));
    }
  }
  // TorchScript's module type is registered by torch's own extension; the
  // pybind11 internals are shared (same compiler ABI), so this is no copy.
  const torch::jit::Module script = has_model ? script_object.cast<torch::jit::Module>() : torch::jit::Module();
  // train trains the caller's module in place; the doctor and lr_find work on copies.
  const bool in_place = c == run::Command::kTrain;
  if (has_model)
    args.model_source = [script, in_place, model_name](const run::RunConfig& config) {
      return mixtrain::scripted_model(in_place ? script : copy_of(script), config.output, config.loss == mixtrain::LossKind::kModel, model_name);
    };
  // bf16-master stores the model in bf16 while it trains; the caller's module gets its dtypes back, also after Ctrl-C.
  struct DtypesRestored {
    std::vector<std::pair<at::Tensor, c10::ScalarType>> dtypes;
    ~DtypesRestored() {
      torch::NoGradGuard no_grad;
      for (auto& [p, dtype] : dtypes)
        if (p.scalar_type() != dtype) p.set_data(p.to(dtype));
    }
  } restored;
  if (has_model)
    for (const auto& p : script.named_parameters()) restored.dtypes.emplace_back(p.value, p.value.scalar_type());

  // Runs take turns (the streams redirected below are the process's); waiting for one
  // must not hold the GIL, which the run in progress needs to print.
  std::optional<run::RunTurn> turn;
  {
    py::gil_scoped_release released;
    turn.emplace();
  }
  py::dict result;
  py::scoped_ostream_redirect to_stdout(std::cout, py::module_::import("sys").attr("stdout"));
  py::scoped_ostream_redirect to_stderr(std::cerr, py::module_::import("sys").attr("stderr"));
  const SigintStopsTheRun sigint;
  // Warnings in Python's words, raised through warnings.warn once the run is over (the
  // Python half does: a filter that makes them errors then raises from the call).
  std::vector<std::string> said;
  const mixtrain::WarningsTo warnings_to([&said](const mixtrain::Phrase& w) { said.push_back(w.str(run::keyword_words())); });
  run::StopFlags stop{&g_stop_requested, nullptr};
  // Python runs its own signal handlers (signal.alarm's) only on the main thread and
  // only between bytecodes: the run asks it to between batches. What a handler
  // raises stops the run (after a checkpoint) and is raised here as it was.
  py::object signal_error[3];
  const bool main_thread = py::module_::import("threading").attr("main_thread")().is(
      py::module_::import("threading").attr("current_thread")());
  if (main_thread)
    stop.poll = [&signal_error] {
      py::gil_scoped_acquire held;
      if (PyErr_CheckSignals() == 0) return false;
      PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
      PyErr_Fetch(&type, &value, &trace);
      signal_error[0] = py::reinterpret_steal<py::object>(type);
      signal_error[1] = py::reinterpret_steal<py::object>(value);
      signal_error[2] = py::reinterpret_steal<py::object>(trace);
      return true;
    };
  const auto raise_signal_error = [&signal_error] {
    if (!signal_error[0]) return;
    PyErr_Restore(signal_error[0].release().ptr(), signal_error[1].release().ptr(), signal_error[2].release().ptr());
    throw py::error_already_set();
  };
  bool interrupted = false;
  try {
  py::gil_scoped_release released;  // Python's other threads run while the model trains
  if (c == run::Command::kTrain) {
    const run::TrainResult r = run::train(args, stop);
    interrupted = r.end == run::TrainResult::End::kInterrupted;  // raised below, with the GIL back
    py::gil_scoped_acquire held;
    result["stopped"] = r.end == run::TrainResult::End::kStopped ? py::object(py::str(r.message.str(run::keyword_words())))
                                                                  : py::object(py::none());
    // The history as the run's files hold it, from the Recorder's one list of columns.
    py::list epochs;
    for (const auto& e : r.epochs) {
      py::dict row;
      for (const auto& [name, value] : mixtrain::epoch_table_row(e, r.metric_names)) row[py::str(name)] = number(name, value);
      epochs.append(row);
    }
    result["epochs"] = epochs;
    py::dict steps;
    for (const auto& c : mixtrain::step_columns()) {
      py::list column;
      for (const auto& s : r.steps) column.append(c.blank_when_nan && std::isnan(c.get(s)) ? py::object(py::none()) : number(c.name, c.get(s)));
      steps[c.name] = column;
    }
    result["steps"] = steps;
    result["summary"] = r.summary;
    result["charts"] = r.charts;
  } else if (c == run::Command::kDoctor) {
    const mixtrain::diagnose::Diagnosis d = run::doctor(args, run::keyword_words(), stop);
    py::gil_scoped_acquire held;
    result["diagnosis"] = d.to_json(run::keyword_words());
    result["report"] = d.report(run::keyword_words());
    result["charts"] = run::doctor_charts(d);
  } else {
    const mixtrain::LrFindResult r = run::lr_find(args, stop);
    py::gil_scoped_acquire held;
    result["valley"] = r.valley;
    result["steep"] = r.steep;
    result["minimum"] = r.minimum;
    result["lrs"] = r.lrs;
    result["losses"] = r.losses;
    result["diverged"] = r.diverged;
    result["svg"] = r.svg();
  }
  } catch (const mixtrain::callbacks::StopRequested&) {  // the GIL is back
    raise_signal_error();
    throw;
  }
  if (interrupted) {
    raise_signal_error();
    throw KeyboardInterrupt{};
  }
  result["warnings"] = said;
  return result;
}

// ---- mixtrain.optim's step: one parameter through the optimizer core (the same code the
// C++ optimizers step with). `hyper` is the param group's dict, in torch.optim's keys.
/// The rule of a param group: `kind` and the group's dict, in torch.optim's keys.
mixtrain::optim::UpdateRule rule_of_group(const std::string& kind, const py::dict& hyper) {
  mixtrain::optim::UpdateRule r;
  const auto parsed = mixtrain::parse_optimizer(kind);
  TORCH_CHECK(parsed, "update_parameter: unknown optimizer ", kind);
  r.kind = *parsed;
  const auto number = [&](const char* key, double& into) {
    if (hyper.contains(key)) into = hyper[key].cast<double>();
  };
  const auto flag = [&](const char* key, bool& into) {
    if (hyper.contains(key)) into = hyper[key].cast<bool>();
  };
  number("lr", r.lr);
  if (hyper.contains("betas")) {
    const auto betas = hyper["betas"].cast<std::pair<double, double>>();
    r.beta1 = betas.first;
    r.beta2 = betas.second;
  }
  number("eps", r.eps);
  number("weight_decay", r.weight_decay);
  flag("amsgrad", r.amsgrad);
  number("momentum", r.momentum);
  number("dampening", r.dampening);
  flag("nesterov", r.nesterov);
  number("alpha", r.alpha);
  flag("centered", r.centered);
  number("lr_decay", r.lr_decay);
  flag("maximize", r.maximize);
  return r;
}

mixtrain::amp::WeightUpdate weight_update_named(const std::string& weight_update) {
  std::optional<mixtrain::amp::WeightUpdate> found;
  for (const auto& [name, value] : mixtrain::amp::weight_update_names())
    if (name == weight_update) found = value;
  TORCH_CHECK(found, "update_parameter: unknown weight_update ", weight_update);
  return *found;
}

py::dict counts_dict(const mixtrain::amp::LostUpdates& lost) {
  py::dict out;
  out["elements"] = lost.elements;
  out["intended"] = lost.intended;
  out["lost"] = lost.lost;
  return out;
}

/// A param group's step in one call (optim::update_parameters: one pass over them all).
/// The lists are parallel, one entry per parameter; returns one counts dict each.
py::list update_parameters(const std::string& kind, const std::vector<torch::Tensor>& params,
                           const std::vector<torch::Tensor>& grads, const std::vector<std::vector<torch::Tensor>>& states,
                           const py::dict& hyper, const std::vector<int64_t>& steps, const std::vector<bool>& fresh_momentum,
                           const std::string& weight_update, const std::vector<std::optional<torch::Tensor>>& compensations,
                           uint64_t seed, const std::vector<uint64_t>& streams) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && states.size() == n && steps.size() == n && fresh_momentum.size() == n &&
                  compensations.size() == n && streams.size() == n,
              "update_parameters: one gradient, state list, step, fresh flag, compensation and stream per parameter");
  const mixtrain::optim::UpdateRule r = rule_of_group(kind, hyper);
  const mixtrain::amp::WeightUpdate rule = weight_update_named(weight_update);
  std::vector<mixtrain::optim::ParamStep> all(n);
  for (size_t i = 0; i < n; ++i) {
    all[i].param = params[i];
    all[i].grad = grads[i];
    all[i].state = states[i];
    if (compensations[i]) all[i].compensation = *compensations[i];
    all[i].step = steps[i];
    all[i].fresh_momentum = fresh_momentum[i];
    all[i].stream = streams[i];
  }
  std::vector<mixtrain::amp::LostUpdates> lost;
  {
    py::gil_scoped_release no_gil;
    lost = mixtrain::optim::update_parameters(r, all, rule, seed);
  }
  py::list out;
  for (const auto& l : lost) out.append(counts_dict(l));
  return out;
}

/// One parameter's step: update_parameters on a group of one (the watch's arms step so).
py::dict update_parameter(const std::string& kind, torch::Tensor param, torch::Tensor grad,
                          std::vector<torch::Tensor> state, const py::dict& hyper, int64_t step, bool fresh_momentum,
                          const std::string& weight_update, std::optional<torch::Tensor> compensation, uint64_t seed,
                          uint64_t stream) {
  return update_parameters(kind, {std::move(param)}, {std::move(grad)}, {std::move(state)}, hyper, {step},
                           {fresh_momentum}, weight_update, {std::move(compensation)}, seed, {stream})[0]
      .cast<py::dict>();
}

} // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "mixtrain's run layer for Python's module objects and tensors (use the mixtrain package)";
  m.def("options", &options, py::arg("command"));
  // The fewest steps a comparison judges (a loop's window is asked for before it is drawn).
  m.attr("MIN_COMPARE_STEPS") = mixtrain::diagnose::kMinCompareSteps;
  // Whether a loss named so is the model's own (its forward then takes the targets last).
  m.def("loss_takes_targets", [](const std::string& loss) { return mixtrain::parse_loss(loss) == mixtrain::LossKind::kModel; },
        py::arg("loss"));
  m.def("run", &run_command, py::arg("command"), py::arg("script"), py::arg("model_name"), py::arg("x"), py::arg("y"),
        py::arg("valid_x"), py::arg("valid_y"), py::arg("settings"), py::arg("out"), py::arg("keep_files"),
        py::arg("loop") = py::none());
  // mixtrain.watch's chart: the doctor's loss-scale history, from the scales a loop's watch read.
  m.def(
      "scale_history_svg",
      [](const std::vector<double>& scales, const std::vector<bool>& skipped, const std::string& precision) {
        if (scales.size() != skipped.size()) throw py::value_error("scale_history_svg: one skipped flag per scale");
        diagnose::RunEvidence run;
        run.precision = precision;
        run.scales = scales;
        run.skipped = skipped;
        return diagnose::scale_history_svg(run);
      },
      py::arg("scales"), py::arg("skipped"), py::arg("precision"));
  // mixtrain.watch's verdict: the rule diagnose::Watch uses, over what the Python watch read.
  m.def(
      "judge_watch",
      [](int64_t steps, int64_t every, std::optional<double> initial_scale, const std::vector<double>& scales,
         const std::vector<std::pair<int64_t, std::vector<std::tuple<std::string, double, double>>>>& ranges,
         const std::vector<std::pair<int64_t, std::vector<std::string>>>& nonfinite_grads,
         const std::vector<std::tuple<std::string, int64_t, int64_t>>& lost, const std::string& weight_update,
         const std::string& lost_counted) {
        diagnose::WatchEvidence e;
        e.steps = steps;
        e.every = every;
        if (initial_scale) e.initial_scale = *initial_scale;
        e.scales = scales;
        for (const auto& [step, modules] : ranges) {
          diagnose::WatchEvidence::Sample sample{step, {}};
          for (const auto& [name, largest, limit] : modules) sample.modules.push_back({name, largest, limit});
          e.ranges.push_back(std::move(sample));
        }
        for (const auto& [step, params] : nonfinite_grads) e.nonfinite_grads.push_back({step, params});
        for (const auto& [param, intended, n] : lost) e.lost.push_back({param, intended, n});
        e.weight_update = weight_update;
        e.lost_counted = lost_counted;
        const diagnose::WatchReport r = diagnose::judge_watch(e);
        const diagnose::WatchSkips skips = diagnose::watch_skips(e);
        py::list cure;
        for (const auto& s : r.cure) cure.append(py::dict(py::arg("key") = s.key, py::arg("value") = s.value));
        return py::dict(py::arg("verdict") = r.verdict, py::arg("evidence") = r.evidence, py::arg("cure") = cure,
                        py::arg("skipped_steps") = skips.steps, py::arg("settling") = skips.settling,
                        py::arg("doctor_steps") = diagnose::kWatchDoctorSteps);
      },
      py::arg("steps"), py::arg("every"), py::arg("initial_scale"), py::arg("scales"), py::arg("ranges"),
      py::arg("nonfinite_grads"), py::arg("lost"), py::arg("weight_update"), py::arg("lost_counted"));
  // An out= folder, by the CLI's rules: train refuses one that holds a run unless forced;
  // the doctor and lr_find (`who`) refuse one that holds a run, whose files they would overwrite.
  m.def(
      "check_out_folder",
      [](const std::string& out, bool force, const std::string& who) {
        const run::RunFolder folder(run::RunFolder::resolve(out));
        if (who.empty())
          folder.refuse_unless_forced(force);
        else
          folder.refuse_run(who);
      },
      py::arg("out"), py::arg("force"), py::arg("who"));
  // The stored-model rule (run/stored_model.h): each module's name and its own floating
  // parameters' dtypes ("bf16", "fp16", "fp32", or another name), as Python reads the model.
  m.def(
      "stored_model_settings",
      [](const std::vector<std::pair<std::string, std::vector<std::string>>>& modules, bool precision_given,
         bool keep_fp32_given, bool keeps_run_mode, bool diagnosing) {
        std::vector<run::ModuleDtypes> read;
        for (const auto& [name, dtypes] : modules) {
          run::ModuleDtypes m{name, {}};
          for (const auto& d : dtypes)
            m.own.push_back(d == "bf16"   ? c10::ScalarType::BFloat16
                            : d == "fp16" ? c10::ScalarType::Half
                            : d == "fp32" ? c10::ScalarType::Float
                                          : c10::ScalarType::Double);  // another dtype: neither rule's
          read.push_back(std::move(m));
        }
        const run::StoredModel stored = run::stored_model(read);
        const run::StoredModelChoice c =
            run::choose_for_stored_model(stored, precision_given, keep_fp32_given, keeps_run_mode, diagnosing);
        py::object sixteen = py::none();
        if (stored.sixteen_bit) sixteen = py::str(*stored.sixteen_bit == c10::ScalarType::BFloat16 ? "bf16" : "fp16");
        py::dict settings;
        if (c.precision) settings["precision"] = precision_name(*c.precision);
        if (c.keep_fp32) settings["keep_fp32"] = *c.keep_fp32;
        return py::dict(py::arg("stored") = sixteen, py::arg("fp32_modules") = stored.fp32_modules,
                        py::arg("settings") = settings,
                        py::arg("notice") = c.notice.empty() ? std::string() : c.notice.str(run::keyword_words()));
      },
      py::arg("modules"), py::arg("precision_given"), py::arg("keep_fp32_given"), py::arg("keeps_run_mode"),
      py::arg("diagnosing"));
  // What libtorch would report deep inside a run (meta, all frozen, float64), asked before
  // Python scripts the model; the CLI asks it where a model is built.
  m.def("refuse_untrainable", py::overload_cast<const std::vector<at::Tensor>&>(&run::refuse_untrainable),
        py::arg("params"));
  // mixtrain.watch's module ranges for a TorchScript model (its submodules take no forward hooks).
  py::class_<diagnose::ModuleRangeTracer>(m, "ModuleRangeTracer")
      .def(py::init<const std::vector<std::pair<std::string, torch::Tensor>>&>(), py::arg("named_params"))
      .def("start", &diagnose::ModuleRangeTracer::start)
      .def("running", &diagnose::ModuleRangeTracer::running)
      .def("stop", [](diagnose::ModuleRangeTracer& tracer) {
        py::list out;
        for (const auto& r : tracer.stop()) out.append(py::make_tuple(r.module, r.largest, r.limit));
        return out;
      });
  m.def("update_parameter", &update_parameter, py::arg("kind"), py::arg("param"), py::arg("grad"), py::arg("state"),
        py::arg("hyper"), py::arg("step"), py::arg("fresh_momentum"), py::arg("weight_update"), py::arg("compensation"),
        py::arg("seed"), py::arg("stream"));
  m.def("update_parameters", &update_parameters, py::arg("kind"), py::arg("params"), py::arg("grads"),
        py::arg("states"), py::arg("hyper"), py::arg("steps"), py::arg("fresh_momentum"), py::arg("weight_update"),
        py::arg("compensations"), py::arg("seed"), py::arg("streams"));
  // Which code the core's CPU passes run (AVX2+FMA loops or one element at a time, the same
  // bits either way): a benchmark's or a report's record of the path it measured.
  m.def("cpu_pass_vectorized", &mixtrain::optim::cpu_pass_vectorized);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const KeyboardInterrupt&) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    } catch (const mixtrain::callbacks::StopRequested&) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    } catch (const mixtrain::OptionError& e) {  // "invalid bs=0: must be >= 1", as Python writes the call
      PyErr_SetString(PyExc_ValueError, e.message(run::keyword_words()).c_str());
    } catch (const c10::Error& e) {  // the line the CLI prints too (a TorchScript traceback's own error)
      PyErr_SetString(PyExc_RuntimeError, mixtrain::innermost_message(e).c_str());
    }
  });
}
