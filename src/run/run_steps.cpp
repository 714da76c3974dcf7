// A run's steps.csv read back (run_steps.h): the run's record, where it went wrong, and the
// replay's check against it.
#include "run_steps.h"

#include "util/read_file.h"
#include "util/short_number.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

namespace mixtrain::run {

using mixtrain::detail::short_number;

namespace {

std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::stringstream in(line);
  while (std::getline(in, field, ',')) out.push_back(field);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

/// A value as steps.csv writes it (ostream, 9 significant digits: float32's all).
std::string as_csv(double v, bool blank_when_nan) {
  if (blank_when_nan && std::isnan(v)) return "";
  std::ostringstream out;
  out.precision(9);
  out << v;
  return out.str();
}

} // namespace

StepsCsv read_steps_csv(const std::string& path) {
  StepsCsv csv;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return csv;
  std::istringstream f(detail::read_whole_file(path, "", detail::kMaxRunFileBytes));  // bounded; no FIFO, no device
  std::string line;
  if (!std::getline(f, line)) return csv;
  csv.header = csv_fields(line);
  while (std::getline(f, line))
    if (!line.empty()) csv.rows.push_back(csv_fields(line));
  return csv;
}

std::vector<std::string> run_record(const RunFolder& folder, const StepsCsv& csv) {
  std::vector<std::string> out;
  if (csv.rows.empty()) {
    out.push_back("no steps.csv: the run recorded no steps");
  } else {
    std::map<int64_t, std::vector<size_t>> by_epoch;
    for (size_t i = 0; i < csv.rows.size(); ++i) {
      try {
        by_epoch[std::stoll(csv.at(i, "epoch"))].push_back(i);
      } catch (const std::exception&) {
      }
    }
    for (const auto& [epoch, rows] : by_epoch) {
      int64_t skipped = 0;
      double lo = INFINITY;
      for (size_t i : rows) {
        skipped += csv.at(i, "skipped") == "1";
        const std::string s = csv.at(i, "scale");
        if (s.empty()) continue;
        const double v = std::strtod(s.c_str(), nullptr);
        lo = std::min(lo, v);
      }
      std::string line = "epoch " + std::to_string(epoch) + ": " + std::to_string(rows.size()) + " steps, loss " +
                         csv.at(rows.front(), "loss") + " -> " + csv.at(rows.back(), "loss");
      if (std::isfinite(lo)) {
        // The epoch's first and last recorded scales: a branch into bf16 records none after the parent's.
        std::string first, last;
        for (size_t i : rows)
          if (const std::string v = csv.at(i, "scale"); !v.empty()) (first.empty() ? first : last) = v;
        if (last.empty()) last = first;
        line += ", " + std::to_string(skipped) + " skipped, loss scale " + first + " -> " + last;
        if (lo < std::min(std::strtod(first.c_str(), nullptr), std::strtod(last.c_str(), nullptr)))
          line += " (lowest " + short_number(lo) + ")";
      }
      out.push_back(line);
    }
  }
  std::error_code ec;
  if (!std::filesystem::exists(folder.file("summary.json"), ec)) return out;
  const std::string summary = detail::read_whole_file(folder.file("summary.json"), "", detail::kMaxRunFileBytes);
  try {
    const nlohmann::json j = nlohmann::json::parse(summary);
    if (j.contains("lost_updates") && j["lost_updates"].is_object()) {
      const auto& l = j["lost_updates"];
      std::string line = "lost updates: " + short_number(100 * l.value("fraction", 0.0), 3) + "% of element updates rounded away (" +
                         l.value("weight_update", std::string("?")) + " rounding)";
      if (l.contains("per_epoch") && l["per_epoch"].is_array() && l["per_epoch"].size() > 1) {
        line += "; per epoch:";
        for (const auto& v : l["per_epoch"]) line += " " + short_number(100 * v.get<double>(), 3) + "%";
      }
      out.push_back(line);
    }
    if (j.contains("stopped") && j["stopped"].is_string()) out.push_back("the NaN stop: " + j["stopped"].get<std::string>());
  } catch (const std::exception&) {
    out.push_back("summary.json is damaged: its lost updates and stop are not shown");
  }
  return out;
}

void check_replay(diagnose::Replay& r, const diagnose::RunEvidence& mixed, const StepsCsv& csv) {
  const size_t first = static_cast<size_t>(mixed.first_step);
  if (csv.rows.size() <= first) {
    r.not_compared = csv.rows.empty() ? "the run has no steps.csv"
                                      : "the run recorded none of the window's steps (it recorded " +
                                            std::to_string(csv.rows.size()) + ")";
    return;
  }
  // A replay "matches" only where a loss was compared: a steps.csv without the column proves nothing.
  if (csv.column("loss") < 0 || mixed.losses.empty()) {
    r.not_compared = csv.column("loss") < 0 ? "the run's steps.csv has no loss column" : "the replay recorded no step";
    return;
  }
  for (size_t k = 0; k < mixed.losses.size() && first + k < csv.rows.size(); ++k) {
    const size_t row = first + k;
    const std::pair<std::string, std::string> compared[] = {
        {"loss", as_csv(mixed.losses[k], false)},
        {"scale", as_csv(k < mixed.scales.size() ? mixed.scales[k] : NAN, true)},
        {"skipped", as_csv(k < mixed.skipped.size() && mixed.skipped[k] ? 1 : 0, false)}};
    for (const auto& [column, replayed] : compared) {
      if (csv.column(column) < 0 || csv.at(row, column) == replayed) continue;
      r.matches_run = false;
      r.first_difference = static_cast<int64_t>(row);
      r.difference = column + " " + replayed + " replayed, " + csv.at(row, column) + " in the run's steps.csv";
      return;
    }
  }
  r.matches_run = true;
}

Onset onset_of_failure(const StepsCsv& csv) {
  Onset o;
  if (csv.column("loss") < 0) return o;
  for (size_t i = 0; i < csv.rows.size(); ++i) {
    const std::string v = csv.at(i, "loss");
    if (v.empty()) continue;
    if (!std::isfinite(std::strtod(v.c_str(), nullptr))) {
      o.step = static_cast<int64_t>(i);
      o.what = "its first NaN/inf loss";
      return o;
    }
  }
  size_t streak = 0;
  while (streak < csv.rows.size() && csv.at(csv.rows.size() - 1 - streak, "skipped") == "1") ++streak;
  if (streak >= static_cast<size_t>(diagnose::kMinCompareSteps)) {
    o.step = static_cast<int64_t>(csv.rows.size() - streak);
    o.what = "the first of the " + std::to_string(streak) + " skipped steps it ended with";
  }
  return o;
}

} // namespace mixtrain::run
