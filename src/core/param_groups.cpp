#include "mixtrain/core/param_groups.h"

#include "mixtrain/util/option_error.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <cstdlib>
#include <sstream>

namespace mixtrain {

namespace {

/// Whether parameter `name` lies under the split point `prefix` ("head" holds "head.weight").
bool under(const std::string& name, const std::string& prefix) {
  return name == prefix || (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
                            name[prefix.size()] == '.');
}

/// "conv, bn, head" (the model's top-level children), to say what a split point may name.
std::string top_level_names(torch::nn::Module& model) {
  std::string out;
  for (const auto& kv : model.named_children()) out += (out.empty() ? "" : ", ") + kv.key();
  return out.empty() ? "none" : out;
}

/// A learning rate as the CLI and args.json write it: the shortest exact form.
std::string number(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  // Prefer the short form when it reads back the same.
  std::ostringstream shorter;
  shorter << v;
  return std::strtod(shorter.str().c_str(), nullptr) == v ? shorter.str() : os.str();
}

double parse_number(const std::string& part, const std::string& text) {
  char* end = nullptr;
  const double v = part.empty() ? NAN : std::strtod(part.c_str(), &end);
  if (part.empty() || end != part.c_str() + part.size())
    throw OptionError("lr", "invalid " + Phrase::name("lr") + " " + text +
                                " (takes 3e-3, a list 1e-4,1e-3 with one per parameter group, or a slice 1e-5:1e-3 or :1e-3)");
  return v;
}

void check_positive(double lr) {
  check_option(lr > 0 && std::isfinite(lr), "lr", lr, "must be > 0");
  // The optimizer and the schedule compute in fp32 tensors too: a larger lr is no number there.
  check_option(lr <= std::numeric_limits<float>::max(), "lr", lr, "must be at most 3.4e38 (fp32's largest)");
}

} // namespace

Splitter split_at(std::vector<std::string> names) {
  TORCH_CHECK(!names.empty(), "split_at needs at least one split point");
  return [names = std::move(names)](torch::nn::Module& model) {
    const auto params = model.named_parameters(/*recurse=*/true);
    ParamGroups groups(1);
    size_t next = 0;  // the split point that starts the next group
    int64_t index = 0;
    for (const auto& kv : params) {
      if (next < names.size() && under(kv.key(), names[next])) {
        if (index == 0)
          throw OptionError("split_at", Phrase::name("split_at") + ": '" + names[next] +
                                            "' holds the model's first parameter, so the group before it would be empty");
        groups.emplace_back();
        ++next;
      }
      for (size_t later = next; later < names.size(); ++later)
        if (under(kv.key(), names[later]))
          throw OptionError("split_at", Phrase::name("split_at") + ": '" + names[later] + "' comes before '" + names[next] +
                                            "' in the model; name the split points in the order of the model's layers");
      groups.back().push_back(kv.value());
      ++index;
    }
    if (next != names.size())
      throw OptionError("split_at", Phrase::name("split_at") + ": no parameter named '" + names[next] + "' or '" +
                                        names[next] + ".*' (the model's top-level children: " + top_level_names(model) + ")");
    return groups;
  };
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty())
      throw OptionError("split_at", Phrase::name("split_at") + ": empty name in '" + text +
                                        "' (takes names separated by commas, e.g. 4,head)");
    out.push_back(part);
  }
  if (out.empty() || text.back() == ',')
    throw OptionError("split_at", Phrase::name("split_at") + ": empty name in '" + text + "' (takes names separated by commas)");
  return out;
}

std::vector<double> even_mults(double start, double stop, int64_t n) {
  TORCH_CHECK(n >= 1, "even_mults: n must be >= 1, got ", n);
  if (n == 1) return {stop};
  const double step = std::pow(stop / start, 1.0 / static_cast<double>(n - 1));
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(start * std::pow(step, static_cast<double>(i)));
  return out;
}

Lrs::Lrs(Kind kind, std::vector<double> values) : kind_(kind), values_(std::move(values)) {
  for (double v : values_) check_positive(v);
}

Lrs::Lrs(double lr) : Lrs(Kind::kEach, {lr}) {}

Lrs::Lrs(std::vector<double> per_group) : Lrs(Kind::kList, std::move(per_group)) {
  TORCH_CHECK(!values_.empty(), "Lrs: an empty list of learning rates");
}

Lrs Lrs::slice(double lo, double hi) {
  Lrs l(Kind::kSlice, {lo, hi});
  TORCH_CHECK(lo <= hi, "lr slice: the first group's lr ", lo, " is above the last group's ", hi);
  return l;
}

Lrs Lrs::slice(double hi) { return Lrs(Kind::kSliceHi, {hi}); }

Lrs Lrs::parse(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon != std::string::npos) {
    const std::string lo = text.substr(0, colon), hi = text.substr(colon + 1);
    if (lo.empty()) return slice(parse_number(hi, text));
    return slice(parse_number(lo, text), parse_number(hi, text));
  }
  if (text.find(',') == std::string::npos) return Lrs(parse_number(text, text));
  std::vector<double> values;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) values.push_back(parse_number(part, text));
  if (text.back() == ',') throw OptionError("lr", "invalid " + Phrase::name("lr") + " " + text + " (a list ends with a number)");
  return Lrs(std::move(values));
}

std::vector<double> Lrs::for_groups(int64_t n_groups) const {
  TORCH_CHECK(n_groups >= 1, "no parameter groups");
  switch (kind_) {
    case Kind::kEach:
      return std::vector<double>(static_cast<size_t>(n_groups), values_[0]);
    case Kind::kList:
      TORCH_CHECK(static_cast<int64_t>(values_.size()) == n_groups, "got ", values_.size(), " learning rates (",
                  str(), ") but the model has ", n_groups, " parameter group", n_groups == 1 ? "" : "s",
                  "; give one per group, or one for all");
      return values_;
    case Kind::kSlice:
      return even_mults(values_[0], values_[1], n_groups);
    case Kind::kSliceHi: {
      std::vector<double> out(static_cast<size_t>(n_groups), values_[0] / 10);
      out.back() = values_[0];
      return out;
    }
  }
  return {};
}

double Lrs::last() const { return values_.back(); }

std::string Lrs::str() const {
  switch (kind_) {
    case Kind::kEach:
      return number(values_[0]);
    case Kind::kSlice:
      return number(values_[0]) + ":" + number(values_[1]);
    case Kind::kSliceHi:
      return ":" + number(values_[0]);
    case Kind::kList: {
      std::string out;
      for (double v : values_) out += (out.empty() ? "" : ",") + number(v);
      return out;
    }
  }
  return {};
}

bool Lrs::operator==(const Lrs& other) const { return kind_ == other.kind_ && values_ == other.values_; }

} // namespace mixtrain
