#pragma once
/// OptionError: a bad value for one option of a run, typed so that a front end
/// can name the option in its own words (a CLI flag, a Python keyword) instead of
/// reading the message. It is a c10::Error: code that catches those keeps working,
/// and what() says it in the library's words.

#include "mixtrain/util/phrase.h"

#include <c10/util/Exception.h>

#include <string>

namespace mixtrain {

class OptionError : public c10::Error {
 public:
  /// A value outside what the option takes. The library says
  /// "Invalid growth_factor: 1 (must be > 1)", a front end "invalid --growth-factor 1: must be > 1".
  OptionError(std::string key, std::string value, std::string requirement);
  /// Any sentence about option `key` (its names rendered in the reader's words).
  OptionError(std::string key, Phrase message);

  /// The option's key (args.json's, the run configuration's).
  const std::string& key() const { return key_; }
  /// The message as a Phrase: a front end renders it in its words.
  Phrase phrase() const;
  /// The message in `words`, one line.
  std::string message(const OptionWords& words) const { return phrase().str(words); }

 private:
  std::string key_, value_, requirement_;
  Phrase phrase_;  // used when requirement_ is empty
};

/// Throws OptionError(key, value, requirement) unless `ok`. The value is any
/// streamable type, shown as c10::str shows it.
template <typename T>
void check_option(bool ok, const std::string& key, const T& value, const std::string& requirement) {
  if (!ok) throw OptionError(key, c10::str(value), requirement);
}

} // namespace mixtrain
