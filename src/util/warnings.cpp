#include "mixtrain/util/warnings.h"

#include <iostream>
#include <utility>

namespace mixtrain {

namespace {
// Per thread: two Python threads may each run (in turn), and a warning belongs to its run.
thread_local WarningSink current_sink;
} // namespace

void warn(const Phrase& warning) {
  if (current_sink) {
    current_sink(warning);
    return;
  }
  std::cerr << "mixtrain: warning: " << warning.str() << std::endl;
}

WarningsTo::WarningsTo(WarningSink sink) : previous_(std::exchange(current_sink, std::move(sink))) {}

WarningsTo::~WarningsTo() { current_sink = std::move(previous_); }

} // namespace mixtrain
