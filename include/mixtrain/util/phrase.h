#pragma once
/// Phrase: a sentence that names options, rendered in the words of whoever reads
/// it. The library says `GradScalerOptions().init_scale(256)`, the CLI says
/// `--init-scale 256`, Python says `init_scale=256`: a fix or an error is written
/// once, with the option's key, and each front end supplies its words. No front
/// end reads the library's sentences.
///
/// Example:
///   mixtrain::Phrase fix = "start the scaler lower: " + mixtrain::Phrase::setting("init_scale", "256");
///   fix.str();                        // "start the scaler lower: GradScalerOptions().init_scale(256)"
///   fix.str(mixtrain::run::cli_words());  // "start the scaler lower: --init-scale 256"

#include <functional>
#include <string>
#include <vector>

namespace mixtrain {

/// How a reader names options. `name(key)`: the option itself ("--init-scale");
/// `setting(key, value)`: the option set to a value ("--init-scale 256").
/// Keys are the run configuration's (args.json's) keys.
struct OptionWords {
  std::function<std::string(const std::string& key)> name;
  std::function<std::string(const std::string& key, const std::string& value)> setting;
  /// How the reader runs the doctor: "`mixtrain doctor`", "`mixtrain.doctor()`".
  std::string doctor = "diagnose::compare()";
};

/// The C++ library's words: the calls and options structs that set each option
/// (`GradScalerOptions().init_scale(256)`, `to_bf16()`, `callbacks::GradientClip(1)`).
const OptionWords& api_words();

class Phrase {
 public:
  Phrase() = default;
  Phrase(std::string text);  // NOLINT: implicit, so plain text is a Phrase
  Phrase(const char* text);  // NOLINT
  /// The option `key` itself, as the reader names it.
  static Phrase name(std::string key);
  /// The option `key` set to `value` (its text as the configuration keeps it).
  static Phrase setting(std::string key, std::string value);
  /// The doctor, as the reader runs it (OptionWords::doctor).
  static Phrase doctor();

  Phrase& operator+=(const Phrase& other);
  friend Phrase operator+(Phrase a, const Phrase& b) { return a += b; }
  friend Phrase operator+(const std::string& a, const Phrase& b) { return Phrase(a) += b; }
  friend Phrase operator+(const char* a, const Phrase& b) { return Phrase(a) += b; }
  friend Phrase operator+(Phrase a, const std::string& b) { return a += Phrase(b); }
  friend Phrase operator+(Phrase a, const char* b) { return a += Phrase(b); }

  /// The sentence in `words` (default: the library's).
  std::string str(const OptionWords& words = api_words()) const;
  bool empty() const { return parts_.empty(); }
  /// The keys of the options it names, in order (a front end may check them).
  std::vector<std::string> keys() const;
  /// Whether it names option `key` set to `value`.
  bool names_setting(const std::string& key, const std::string& value) const;

 private:
  struct Part {
    enum Kind { kText, kName, kSetting, kDoctor } kind = kText;
    std::string text;  // the text, or the key
    std::string value;
  };
  std::vector<Part> parts_;
};

} // namespace mixtrain
