#include "mixtrain/util/phrase.h"

#include "util/comma_list.h"
#include <algorithm>
#include <cctype>
#include <map>

namespace mixtrain {

namespace {

/// The library call behind a precision mode's name.
std::string precision_call(const std::string& mode) {
  if (mode == "fp16") return "to_fp16()";
  if (mode == "bf16") return "to_bf16()";
  if (mode == "bf16-master") return "to_half(MasterWeightsOptions().dtype(kBFloat16))";
  if (mode == "fp16-master") return "to_half()";
  if (mode == "fp32") return "to_fp32()";
  if (mode == "bf16-pure") return "set_precision(Precision::kBf16Pure)";
  return "set_precision(parse_precision(\"" + mode + "\"))";
}

/// Where each option lives in the C++ API; an option not listed is a field of
/// RunConfig under its key.
const std::map<std::string, std::string>& api_homes() {
  static const std::map<std::string, std::string> kHomes = {
      {"init_scale", "GradScalerOptions()."},       {"growth_factor", "GradScalerOptions()."},
      {"backoff_factor", "GradScalerOptions()."},   {"growth_interval", "GradScalerOptions()."},
      {"loss_scale", "MasterWeightsOptions()."},    {"max_noskip", "MasterWeightsOptions()."},
      {"max_scale", "MasterWeightsOptions()."},     {"flat_master", "MasterWeightsOptions()."},
      {"keep_fp32", "PrecisionOptions()."},         {"weight_update", "PrecisionOptions()."},
  };
  return kHomes;
}

} // namespace

const OptionWords& api_words() {
  static const OptionWords kWords{
      [](const std::string& key) {
        if (key == "no_emulation") return std::string("allow_fp16_emulation");
        return key;
      },
      [](const std::string& key, const std::string& value) {
        if (key == "precision") return precision_call(value);
        if (key == "clip") return "callbacks::GradientClip(" + value + ")";
        if (key == "accum") return "callbacks::GradientAccumulation(" + value + ")";
        if (key == "no_emulation") return std::string("allow_fp16_emulation(") + (value == "true" ? "false" : "true") + ")";
        if (key == "lr") return "fit_one_cycle(epochs, " + value + ")";
        if (key == "keep_fp32") return "PrecisionOptions().keep_fp32({" + detail::quoted_list(value) + "})";
        if (key == "weight_update") {  // the enum's constant, so that the line compiles as printed
          std::string constant = value;
          if (!constant.empty()) constant[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(constant[0])));
          return "PrecisionOptions().weight_update(amp::WeightUpdate::k" + constant + ")";
        }
        const auto home = api_homes().find(key);
        return (home == api_homes().end() ? std::string("RunConfig().") : home->second) + key + "(" + value + ")";
      }};
  return kWords;
}

Phrase::Phrase(std::string text) {
  if (!text.empty()) parts_.push_back({Part::kText, std::move(text), {}});
}
Phrase::Phrase(const char* text) : Phrase(std::string(text)) {}

Phrase Phrase::name(std::string key) {
  Phrase p;
  p.parts_.push_back({Part::kName, std::move(key), {}});
  return p;
}

Phrase Phrase::setting(std::string key, std::string value) {
  Phrase p;
  p.parts_.push_back({Part::kSetting, std::move(key), std::move(value)});
  return p;
}

Phrase Phrase::doctor() {
  Phrase p;
  p.parts_.push_back({Part::kDoctor, {}, {}});
  return p;
}

Phrase& Phrase::operator+=(const Phrase& other) {
  parts_.insert(parts_.end(), other.parts_.begin(), other.parts_.end());
  return *this;
}

std::string Phrase::str(const OptionWords& words) const {
  std::string out;
  for (const auto& p : parts_) {
    switch (p.kind) {
      case Part::kText: out += p.text; break;
      case Part::kName: out += words.name(p.text); break;
      case Part::kSetting: out += words.setting(p.text, p.value); break;
      case Part::kDoctor: out += words.doctor; break;
    }
  }
  return out;
}

std::vector<std::string> Phrase::keys() const {
  std::vector<std::string> out;
  for (const auto& p : parts_)
    if (p.kind == Part::kName || p.kind == Part::kSetting) out.push_back(p.text);
  return out;
}

bool Phrase::names_setting(const std::string& key, const std::string& value) const {
  for (const auto& p : parts_)
    if (p.kind == Part::kSetting && p.text == key && p.value == value) return true;
  return false;
}

} // namespace mixtrain
