#pragma once
/// Where mixtrain's warnings go. A warning is one line that names options, so each
/// front end says it in its own words: the CLI prints `mixtrain: warning: --weight-update
/// stochastic ...` to stderr, Python raises `warnings.warn(..., mixtrain.MixtrainWarning)`
/// with `weight_update="stochastic"`, the library (the default) prints its own words.
///
/// Example (a front end collecting its run's warnings):
///   std::vector<std::string> said;
///   const mixtrain::WarningsTo to([&](const mixtrain::Phrase& w) { said.push_back(w.str(my_words)); });
///   ... run ...
#include "mixtrain/util/phrase.h"

#include <functional>

namespace mixtrain {

using WarningSink = std::function<void(const Phrase& warning)>;

/// Says `warning` through this thread's sink (a run says its warnings on the thread it
/// runs on); without one, prints "mixtrain: warning: " and the library's words to stderr.
void warn(const Phrase& warning);

/// Sends this thread's warnings to `sink` while it lives, then to the sink before it.
class WarningsTo {
 public:
  explicit WarningsTo(WarningSink sink);
  ~WarningsTo();
  WarningsTo(const WarningsTo&) = delete;
  WarningsTo& operator=(const WarningsTo&) = delete;

 private:
  WarningSink previous_;
};

} // namespace mixtrain
