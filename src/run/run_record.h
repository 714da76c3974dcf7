#pragma once
// Private to the run layer: what every checkpoint of a run records about the run (its
// configuration and its input files' fingerprints), and the checks that a resume and a
// branch (train --from, doctor --from) make against it. The checkpoint is the witness:
// args.json and the files it names may have been edited since, and a run continued on
// them would silently be another run.

#include "mixtrain/core/callback.h"
#include "mixtrain/run/run_config.h"
#include "mixtrain/util/phrase.h"

#include <map>
#include <optional>
#include <string>

namespace mixtrain::run {

/// The input files a run reads (its data and model files, by option key) as
/// "size bytes, crc32 X": what a resume or a branch must find again.
std::map<std::string, std::string> input_fingerprints(const RunConfig& r);

/// Keeps the run's configuration and its input files' fingerprints in every checkpoint.
class RunRecord : public Callback {
 public:
  RunRecord(std::string json, std::map<std::string, std::string> inputs) : json_(std::move(json)), inputs_(std::move(inputs)) {}
  std::string name() const override { return "RunRecord"; }
  std::string state_key() const override { return kKey; }
  void save_state(torch::serialize::OutputArchive& ar) const override;

  static constexpr const char* kKey = "run_config";

 private:
  std::string json_;
  std::map<std::string, std::string> inputs_;
};

/// What a checkpoint's run record holds.
struct Recorded {
  RunConfig config;
  std::map<std::string, std::string> inputs;  ///< empty in checkpoints of 0.2's first sessions
};

/// The record of the checkpoint file at `path`, or nullopt for a checkpoint of an older
/// version (it holds none); throws c10::Error for a damaged one.
std::optional<Recorded> recorded_run(const std::string& path);
/// The same from a checkpoint's bytes (`name` stands for the file in messages).
std::optional<Recorded> recorded_run(const std::string& bytes, const std::string& name);

/// How a check names what it refuses: "cannot resume RUN" / "its checkpoints" / "a resume
/// continues that run (...)".
struct SameRunWords {
  Phrase cannot;      ///< "cannot resume RUN", "cannot branch from RUN"
  Phrase trained_by;  ///< "its checkpoints were", "RUN/checkpoint-8.pt was"
  Phrase continues;   ///< "a resume continues that run", "--from continues that run"
  Phrase instead;     ///< what else to do, after "put args.json back" / "put it back" (", or ...")
};

/// args.json (`now`) describes the run that `trained` (the checkpoint's record) was: every
/// stored option alike but --threads. Throws OptionError naming the first difference.
void check_same_run(const RunConfig& trained, const RunConfig& now, const SameRunWords& words);
/// The input files are the ones the checkpoint was trained on. Throws OptionError naming one that is not.
void check_same_inputs(const std::map<std::string, std::string>& trained, const std::map<std::string, std::string>& current,
                       const RunConfig& now, const SameRunWords& words);

} // namespace mixtrain::run
