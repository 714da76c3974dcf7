#include "learner_from_flags.h"

#include <algorithm>
#include <string>

namespace mixtrain_cli {

mixtrain::data::DatasetSplit load_split(const mixtrain::RunConfig& r, int world_size) {
  auto split = mixtrain::data::fashion_mnist(r.data);
  if (r.limit > 0) split.train = split.train.head(r.limit);
  // Under data parallelism every rank gets its shard of the training set.
  const int64_t per_rank = split.train.size() / std::max(1, world_size);
  const std::string each = world_size > 1 ? ", " + std::to_string(per_rank) + " per rank of " +
                                                std::to_string(world_size) : "";
  if (per_rank < r.bs)
    throw UsageError("the training set (" + std::to_string(split.train.size()) + " images" + each +
                     ") is smaller than --bs " + std::to_string(r.bs) + ": no full batch to train on");
  if (r.accum > per_rank / r.bs)
    throw UsageError("--accum " + std::to_string(r.accum) + " is more than the " + std::to_string(per_rank / r.bs) +
                     " batches of an epoch" + (each.empty() ? "" : " (" + each.substr(2) + ")") +
                     ": no optimizer step would run");
  return split;
}

std::unique_ptr<mixtrain::Learner> build_learner(const mixtrain::RunConfig& r, const mixtrain::data::DatasetSplit& split,
                                                 bool progress) {
  auto learn = std::make_unique<mixtrain::Learner>(
      mixtrain::models::by_name(r.model), mixtrain::data::DataLoaders::from_split(split, r.bs, r.seed),
      mixtrain::cross_entropy(),
      mixtrain::LearnerOptions().metrics({mixtrain::accuracy()}).progress(progress).wd_bn_bias(r.wd_bn_bias));
  // Orders 20 and 5: they run after / before the precision callbacks added later, whatever the insertion order.
  if (r.clip > 0) learn->add_cb(std::make_shared<mixtrain::callbacks::GradientClip>(r.clip));
  if (r.accum > 1) learn->add_cb(std::make_shared<mixtrain::callbacks::GradientAccumulation>(r.accum));
  return learn;
}

} // namespace mixtrain_cli
