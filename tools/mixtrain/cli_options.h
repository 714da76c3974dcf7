#pragma once
// The CLI's flags, made from the run layer's option table: each subcommand gets
// the options its command takes, in their own words. Values are collected as
// text while CLI11 parses and applied through the table afterwards, so every
// bad value is reported the same way, naming its flag.

#include <mixtrain/run/options.h>

#include <CLI/CLI.hpp>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace mixtrain_cli {

constexpr int kExitError = 2;

/// A user error: printed as one line, exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The flags one subcommand was given, as text, by option key.
struct GivenFlags {
  std::map<std::string, std::string> values;
  bool has(const std::string& key) const { return values.count(key) > 0; }
  /// The keys given, in the table's order.
  std::vector<std::string> keys() const;
};

/// Adds the flags of every option `command` takes to `cmd`; what the user gives lands in `given`.
void add_flags(CLI::App& cmd, mixtrain::run::Command command, GivenFlags& given);

/// `command`'s defaults with the given flags applied in the table's order; a value
/// that does not parse is a UsageError naming its flag.
mixtrain::run::RunArgs apply_flags(mixtrain::run::Command command, const GivenFlags& given);

/// Refuses, in one line, a flag of another subcommand among `args` (the words
/// after the subcommand's name): "mixtrain lr_find does not take --epochs (train and doctor do)".
void reject_foreign_flags(mixtrain::run::Command command, const std::vector<std::string>& args);

} // namespace mixtrain_cli
