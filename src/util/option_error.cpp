#include "mixtrain/util/option_error.h"

namespace mixtrain {

namespace {
c10::SourceLocation here() { return {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}; }
} // namespace

OptionError::OptionError(std::string key, std::string value, std::string requirement)
    : c10::Error(here(), "Invalid " + key + ": " + value + " (" + requirement + ")"),
      key_(std::move(key)),
      value_(std::move(value)),
      requirement_(std::move(requirement)) {}

OptionError::OptionError(std::string key, Phrase message)
    : c10::Error(here(), message.str()), key_(std::move(key)), phrase_(std::move(message)) {}

Phrase OptionError::phrase() const {
  if (requirement_.empty()) return phrase_;
  // The value as the reader sets it: "--bs 0" on the command line, "bs=0" in Python.
  return "invalid " + Phrase::setting(key_, value_) + ": " + requirement_;
}

} // namespace mixtrain
