#pragma once
/// Parameter groups, as fastai's: a splitter cuts a model's parameters into
/// groups (a pretrained body, a new head), each group gets its own learning rate
/// (fastai's slice(lo, hi) spreads them), and Learner::freeze_to trains only the
/// later groups. This is what fine-tuning a pretrained model needs.

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mixtrain {

/// Parameters in groups, earliest layers first (fastai's splitter). A parameter
/// the splitter leaves out is not trained, as in fastai.
using ParamGroups = std::vector<std::vector<torch::Tensor>>;
using Splitter = std::function<ParamGroups(torch::nn::Module& model)>;

/// A splitter that starts a new group at each named submodule or parameter, in
/// the order of model.named_parameters(): split_at({"head"}) gives two groups,
/// everything before the submodule `head` and `head` with everything after it.
/// Names are parameter-name prefixes ("4", "blocks.2", "head.weight"). The
/// splitter throws c10::Error naming a split point that matches no parameter,
/// one that starts the model (the first group would be empty), and points given
/// out of order.
Splitter split_at(std::vector<std::string> names);
/// "a,b" -> {"a", "b"}; empty parts are an error (c10::Error naming the text).
std::vector<std::string> split_names(const std::string& comma_separated);

/// fastai's even_mults: n values from `start` to `stop`, evenly spaced on a log
/// scale (n == 1: {stop}).
std::vector<double> even_mults(double start, double stop, int64_t n);

/// The learning rates of a fit, one per parameter group, as fastai's lr
/// argument takes them: one value for every group, one value per group, or a
/// slice spread over the groups.
///
/// Example:
///   learn.fit_one_cycle(3, mixtrain::lr_slice(1e-5, 1e-3));  // groups from 1e-5 to 1e-3
///   learn.fit_one_cycle(3, mixtrain::Lrs({1e-4, 1e-3}));     // exactly two groups
class Lrs {
 public:
  /// The same learning rate for every group.
  Lrs(double lr);  // NOLINT: implicit on purpose, so fit(1, 3e-3) reads as before
  /// One learning rate per group (the list must have as many values as the model
  /// has groups). Note that Lrs({x}) is the double constructor, x for every group;
  /// a one-element list is Lrs(std::vector<double>{x}).
  explicit Lrs(std::vector<double> per_group);
  /// fastai's slice(lo, hi): geometric steps from lo (first group) to hi (last).
  static Lrs slice(double lo, double hi);
  /// fastai's slice(hi): hi for the last group, hi / 10 for every other.
  static Lrs slice(double hi);
  /// Parses what the CLI's --lr takes: "3e-3", "1e-4,1e-3" (one per group),
  /// "1e-5:1e-3" (slice(lo, hi)) or ":1e-3" (slice(hi)). Throws c10::Error naming the text.
  static Lrs parse(const std::string& text);

  /// The learning rate of each of `n_groups` groups. Throws c10::Error when a
  /// list's length differs from n_groups.
  std::vector<double> for_groups(int64_t n_groups) const;
  /// The last group's learning rate (what fastai reports, and the peak of a slice).
  double last() const;
  /// Whether it is one value for every group (not a list or a slice).
  bool one_for_all() const { return kind_ == Kind::kEach; }
  /// The form parse() reads back.
  std::string str() const;
  bool operator==(const Lrs& other) const;

 private:
  enum class Kind { kEach, kList, kSlice, kSliceHi };
  Lrs(Kind kind, std::vector<double> values);
  Kind kind_;
  std::vector<double> values_;
};

/// fastai's slice(lo, hi) and slice(hi) (Lrs::slice).
inline Lrs lr_slice(double lo, double hi) { return Lrs::slice(lo, hi); }
inline Lrs lr_slice(double hi) { return Lrs::slice(hi); }

} // namespace mixtrain
