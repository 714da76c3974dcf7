#include "cli_options.h"

#include <mixtrain/util/option_error.h>

namespace mixtrain_cli {

namespace run = mixtrain::run;

std::vector<std::string> GivenFlags::keys() const {
  std::vector<std::string> out;
  for (const auto& o : run::options())
    if (has(o.key)) out.push_back(o.key);
  return out;
}

void add_flags(CLI::App& cmd, run::Command command, GivenFlags& given) {
  const run::RunArgs defaults = run::defaults_for(command);
  for (const run::Option& o : run::options()) {
    if (!o.takes(command) || o.flag.empty()) continue;
    const std::string key = o.key;
    CLI::Option* flag = nullptr;
    if (o.type == run::ValueType::kSwitch) {
      flag = cmd.add_flag_function(o.flag, [&given, key](int64_t) { given.values[key] = "true"; }, o.help_in(command));
    } else {
      flag = cmd.add_option_function<std::string>(
          o.flag, [&given, key](const std::string& v) { given.values[key] = v; }, o.help_in(command));
      if (o.show_default) flag->default_str(o.get(defaults));
      flag->type_name(o.type == run::ValueType::kInt ? "N" : o.type == run::ValueType::kNumber ? "X"
                      : o.type == run::ValueType::kLrs ? "LR" : o.type == run::ValueType::kList ? "NAME[,NAME...]" : "TEXT");
    }
    if (o.hidden) flag->group("");
  }
}

run::RunArgs apply_flags(run::Command command, const GivenFlags& given) {
  run::RunArgs args = run::defaults_for(command);
  for (const run::Option& o : run::options()) {
    const auto it = given.values.find(o.key);
    if (it == given.values.end()) continue;
    args.given.push_back(o.key);
    try {
      o.set(args, it->second);
      // An empty value is a mistake (an unset shell variable), not the default in disguise:
      // --data '' would otherwise train on Fashion-MNIST without a word.
      if (o.type == run::ValueType::kText && it->second.empty())
        throw UsageError("an empty " + o.flag + ": give it a value, or leave " + o.flag + " out for its default");
    } catch (const mixtrain::OptionError& e) {
      throw UsageError(e.message(run::flag_words()));
    } catch (const c10::Error& e) {
      throw UsageError("invalid " + o.flag + " " + it->second + ": " + e.msg());
    }
  }
  return args;
}

void reject_foreign_flags(run::Command command, const std::vector<std::string>& args) {
  for (const std::string& word : args) {
    if (word == "--") break;
    if (word.rfind("--", 0) != 0) continue;
    const run::Option* o = run::find_flag(word.substr(0, word.find('=')));
    if (!o || o->takes(command)) continue;  // unknown flags are CLI11's to report
    std::vector<std::string> takers;
    for (run::Command c : {run::Command::kTrain, run::Command::kDoctor, run::Command::kLrFind})
      if (o->takes(c)) takers.push_back(run::command_name(c));
    std::string who;
    for (size_t i = 0; i < takers.size(); ++i) who += (i == 0 ? "" : i + 1 == takers.size() ? " and " : ", ") + takers[i];
    throw UsageError(std::string("mixtrain ") + run::command_name(command) + " does not take " + o->flag +
                     (who.empty() ? "" : " (" + who + (takers.size() == 1 ? " does)" : " do)")));
  }
}

} // namespace mixtrain_cli
