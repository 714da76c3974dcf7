#pragma once
// Private, header-only: where a doctor's time goes (Diagnosis::timing), phase by phase.

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain::diagnose::detail {

/// Each phase's seconds, in order: ends("pair") closes the phase that began at the last end.
class PhaseClock {
 public:
  void ends(const char* phase) {
    const auto now = std::chrono::steady_clock::now();
    phases_.emplace_back(phase, std::chrono::duration<double>(now - start_).count());
    start_ = now;
  }
  bool empty() const { return phases_.empty(); }
  const std::vector<std::pair<std::string, double>>& phases() const { return phases_; }

 private:
  std::vector<std::pair<std::string, double>> phases_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

} // namespace mixtrain::diagnose::detail
