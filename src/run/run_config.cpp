// args.json (mixtrain/run/run_config.h): a RunConfig written and read through the option
// table's stored rows, so that a new option needs no edit here.
#include "mixtrain/run/run_config.h"

#include "mixtrain/run/options.h"
#include "mixtrain/util/atomic_file.h"
#include "mixtrain/util/option_error.h"

#include "util/comma_list.h"
#include "util/read_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace mixtrain::run {

// ---- args.json: the stored rows of the table ----------------------------------

std::string RunConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  RunArgs a;
  a.config = *this;
  for (const auto& o : options()) {
    if (!o.stored) continue;
    const std::string v = o.get(a);
    switch (o.type) {
      case ValueType::kSwitch: j[o.key] = v == "true"; break;
      // The seed is a uint64: keep every digit.
      case ValueType::kInt:
        if (v[0] == '-') j[o.key] = std::stoll(v);
        else j[o.key] = std::stoull(v);
        break;
      case ValueType::kNumber: j[o.key] = std::strtod(v.c_str(), nullptr); break;
      case ValueType::kText: j[o.key] = v; break;
      case ValueType::kList:
        j[o.key] = v.empty() ? nlohmann::json::array() : nlohmann::json(detail::comma_list(v));
        break;
      // One learning rate is a number (as args.json always had it); a list or slice is Lrs::parse's text.
      case ValueType::kLrs:
        if (lr.one_for_all()) j[o.key] = lr.last();
        else j[o.key] = v;
        break;
    }
  }
  return j.dump(2) + "\n";
}

RunConfig RunConfig::from_json(const std::string& text) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "not valid JSON (", e.what(), ")");
  }
  TORCH_CHECK(j.is_object(), "not a JSON object");
  for (const auto& item : j.items()) {
    const Option* o = find_option(item.key());
    TORCH_CHECK(o && o->stored, "unknown field '", item.key(), "' (written by a newer mixtrain, or edited by hand?)");
  }
  RunArgs a;
  for (const auto& o : options()) {
    if (!o.stored) continue;
    if (!j.contains(o.key)) {
      TORCH_CHECK(o.added_later, "field '", o.key, "' is missing");
      continue;  // an older run folder: the default applies
    }
    const json& v = j.at(o.key);
    std::string value;
    bool typed = false;  // the JSON type fits the option's
    const char* expected = "";
    switch (o.type) {
      case ValueType::kSwitch:
        expected = "true or false";
        if ((typed = v.is_boolean())) value = v.get<bool>() ? "true" : "false";
        break;
      case ValueType::kInt:
        expected = "an integer";
        if ((typed = v.is_number_integer())) value = v.is_number_unsigned() ? std::to_string(v.get<uint64_t>()) : std::to_string(v.get<int64_t>());
        break;
      case ValueType::kNumber:
        expected = "a number";
        if ((typed = v.is_number())) value = format_number(v.get<double>());
        break;
      case ValueType::kText:
        expected = "a string";
        if ((typed = v.is_string())) value = v.get<std::string>();
        break;
      case ValueType::kList:
        expected = "a list of strings";
        typed = v.is_array() && std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); });
        if (typed && v.empty()) continue;  // none: the default
        if (typed) value = detail::comma_joined(v.get<std::vector<std::string>>());
        break;
      case ValueType::kLrs:
        expected = "a number or a list/slice as text";
        typed = v.is_number() || v.is_string();
        if (typed) value = v.is_number() ? format_number(v.get<double>()) : v.get<std::string>();
        break;
    }
    TORCH_CHECK(typed, "field '", o.key,
                "' has the wrong type (expected ", expected, ", got ", v.dump(), ")");
    try {
      o.set(a, value);
    } catch (const OptionError& e) {
      TORCH_CHECK(false, "field '", o.key, "': ", e.what_without_backtrace());
    }
  }
  return a.config;
}

void RunConfig::write(const std::string& dir) const { write_file_atomically(dir + "/args.json", to_json()); }

RunConfig RunConfig::read(const std::string& dir) {
  const std::string path = dir + "/args.json";
  std::error_code ec;
  TORCH_CHECK(std::filesystem::exists(path, ec), path, " not found (is ", dir, " a mixtrain run directory?)");
  // Bounded, and only a regular file: a link to /dev/zero or a FIFO is refused, not read forever.
  const std::string text = detail::read_whole_file(path, "", detail::kMaxRunFileBytes);
  // Only a file that is not JSON is damaged; a JSON file with a bad field says which.
  const bool is_json = nlohmann::json::accept(text);
  try {
    return from_json(text);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, path, is_json ? ": " : " is damaged: ", e.msg());
  }
}

} // namespace mixtrain::run
