#include "mixtrain/run_config.h"

#include "mixtrain/atomic_file.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <vector>

namespace mixtrain {

namespace {

using nlohmann::json;

/// One field of args.json: how to read it from a RunConfig and how to set it back.
struct Field {
  const char* name;
  std::function<json(const RunConfig&)> get;
  std::function<void(RunConfig&, const json&)> set;
  bool added_later = false;  ///< absent from older args.json files: the default applies
};

Field added_later(Field f) {
  f.added_later = true;
  return f;
}

template <typename T>
Field member(const char* name, T RunConfig::*m) {
  return {name, [m](const RunConfig& c) { return json(c.*m); }, [m](RunConfig& c, const json& j) { c.*m = j.get<T>(); }};
}

/// A field kept inside an options struct, through its TORCH_ARG accessors.
template <typename T, typename Options>
Field option(const char* name, Options& (*of)(RunConfig&), T& (Options::*arg)()) {
  return {name, [of, arg](const RunConfig& c) { return json((of(const_cast<RunConfig&>(c)).*arg)()); },
          [of, arg](RunConfig& c, const json& j) { (of(c).*arg)() = j.get<T>(); }};
}

amp::GradScalerOptions& scaler(RunConfig& c) { return c.precision_options.scaler(); }
amp::MasterWeightsOptions& master(RunConfig& c) { return c.precision_options.master(); }

const std::vector<Field>& fields() {
  using S = amp::GradScalerOptions;
  using M = amp::MasterWeightsOptions;
  static const std::vector<Field> kFields = {
      member("data", &RunConfig::data),
      member("model", &RunConfig::model),
      member("loss", &RunConfig::loss),
      member("monitor", &RunConfig::monitor),
      member("save_best", &RunConfig::save_best),
      member("early_stop", &RunConfig::early_stop),
      member("epochs", &RunConfig::epochs),
      // One learning rate is a number (as args.json always had it); a list or slice is Lrs::parse's text.
      {"lr", [](const RunConfig& c) { return c.lr.one_for_all() ? json(c.lr.last()) : json(c.lr.str()); },
       [](RunConfig& c, const json& j) { c.lr = j.is_string() ? Lrs::parse(j.get<std::string>()) : Lrs(j.get<double>()); }},
      added_later(member("split_at", &RunConfig::split_at)),
      added_later(member("freeze_to", &RunConfig::freeze_to)),
      member("bs", &RunConfig::bs),
      member("seed", &RunConfig::seed),
      member("limit", &RunConfig::limit),
      member("threads", &RunConfig::threads),
      {"precision", [](const RunConfig& c) { return json(precision_name(c.precision)); },
       [](RunConfig& c, const json& j) { c.precision = parse_precision(j.get<std::string>()); }},
      option<double>("init_scale", &scaler, static_cast<double& (S::*)()>(&S::init_scale)),
      option<double>("growth_factor", &scaler, static_cast<double& (S::*)()>(&S::growth_factor)),
      option<double>("backoff_factor", &scaler, static_cast<double& (S::*)()>(&S::backoff_factor)),
      option<int64_t>("growth_interval", &scaler, static_cast<int64_t& (S::*)()>(&S::growth_interval)),
      {"no_emulation", [](const RunConfig& c) { return json(!c.precision_options.allow_fp16_emulation()); },
       [](RunConfig& c, const json& j) { c.precision_options.allow_fp16_emulation(!j.get<bool>()); }},
      option<double>("loss_scale", &master, static_cast<double& (M::*)()>(&M::loss_scale)),
      option<bool>("dynamic", &master, static_cast<bool& (M::*)()>(&M::dynamic)),
      option<int64_t>("max_noskip", &master, static_cast<int64_t& (M::*)()>(&M::max_noskip)),
      option<double>("max_scale", &master, static_cast<double& (M::*)()>(&M::max_scale)),
      option<bool>("flat_master", &master, static_cast<bool& (M::*)()>(&M::flat_master)),
      member("clip", &RunConfig::clip),
      member("accum", &RunConfig::accum),
      member("wd_bn_bias", &RunConfig::wd_bn_bias),
      member("save_every", &RunConfig::save_every),
      member("keep", &RunConfig::keep),
      member("max_bad_steps", &RunConfig::max_bad_steps),
      member("comm_dtype", &RunConfig::comm_dtype),
      member("ranks", &RunConfig::ranks),
  };
  return kFields;
}

} // namespace

std::string RunConfig::to_json() const {
  json j = json::object();
  for (const auto& f : fields()) j[f.name] = f.get(*this);
  return j.dump(2) + "\n";
}

RunConfig RunConfig::from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "not valid JSON (", e.what(), ")");
  }
  TORCH_CHECK(j.is_object(), "not a JSON object");
  RunConfig c;
  for (const auto& f : fields()) {
    if (f.added_later && !j.contains(f.name)) continue;
    TORCH_CHECK(j.contains(f.name), "field '", f.name, "' is missing");
    try {
      f.set(c, j.at(f.name));
    } catch (const json::exception& e) {
      TORCH_CHECK(false, "field '", f.name, "' has the wrong type (", e.what(), ")");
    }
  }
  return c;
}

void RunConfig::write(const std::string& dir) const { write_file_atomically(dir + "/args.json", to_json()); }

RunConfig RunConfig::read(const std::string& dir) {
  const std::string path = dir + "/args.json";
  std::ifstream f(path);
  TORCH_CHECK(f, path, " not found (is ", dir, " a mixtrain run directory?)");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    return from_json(text);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, path, " is damaged: ", e.msg());
  }
}

} // namespace mixtrain
