#pragma once
// Private to the run layer: a run's steps.csv read back, for the doctor that branches from
// the run (doctor.cpp): what the run recorded (its record, where it went wrong) and whether
// a replay computed what the run did.

#include "mixtrain/diagnose/compare.h"
#include "mixtrain/diagnose/diagnosis.h"
#include "mixtrain/run/run_folder.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain::run {

/// steps.csv as text: its header and rows, the values as the run wrote them.
struct StepsCsv {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  int column(const std::string& name) const {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? -1 : static_cast<int>(it - header.begin());
  }
  std::string at(size_t row, const std::string& name) const {
    const int c = column(name);
    return c < 0 || row >= rows.size() || static_cast<size_t>(c) >= rows[row].size() ? "" : rows[row][static_cast<size_t>(c)];
  }
};

/// RUN/steps.csv (bounded; no FIFO, no device); empty when there is none.
StepsCsv read_steps_csv(const std::string& path);

/// What the run recorded before anything is replayed: the seed guide's "check the loss
/// scale history" per epoch, its lost updates and its NaN stop (summary.json).
std::vector<std::string> run_record(const RunFolder& folder, const StepsCsv& csv);

/// The replayed mixed arm against the steps the run recorded (loss, scale and skip): sets
/// `r.matches_run` only where a loss was compared, else says why in `r.not_compared`.
void check_replay(diagnose::Replay& r, const diagnose::RunEvidence& mixed, const StepsCsv& csv);

/// Where a run that did not finish went wrong, by its steps.csv: its first NaN/inf loss,
/// else the first of its last steps when it skipped at least kMinCompareSteps of them in a
/// row (a scale backing off at every step). step -1: neither.
struct Onset {
  int64_t step = -1;
  std::string what;
};

Onset onset_of_failure(const StepsCsv& csv);

} // namespace mixtrain::run
