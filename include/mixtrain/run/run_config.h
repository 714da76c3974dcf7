#pragma once
/// RunConfig: the settings of one training run, as the run folder keeps them
/// (OUT/args.json) so that a resume needs nothing else. Each field is described
/// once, in the option table (mixtrain/run/options.h): its key, flag, help and
/// default; args.json is read and written from that table.

#include "mixtrain/amp/precision_options.h"
#include "mixtrain/core/optimizers.h"
#include "mixtrain/core/param_groups.h"
#include "mixtrain/models/loss.h"
#include "mixtrain/util/threads.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

namespace mixtrain::run {

struct RunConfig {
  /// Fashion-MNIST's directory, a tensor file (torch.save'd dict), or for a text
  /// model a text file or directory; empty: the model's own data (the registry's).
  std::string data;
  std::string model = "cnn";                  ///< built-in model name, or a TorchScript file
  LossKind loss = LossKind::kCrossEntropy;    ///< cross_entropy, mse, bce_with_logits or the model's own
  std::string output;                         ///< which part of a structured model output is the prediction ("": the default rule)
  int64_t epochs = 1;
  Lrs lr = 3e-3;                              ///< peak of the one-cycle schedule, or one per parameter group
  int64_t bs = 256;                           ///< batch size (per rank under data parallelism)
  uint64_t seed = 42;
  int64_t limit = -1;                         ///< first N training samples (-1: all)
  int threads = 0;                            ///< threads in all (0: all cores)
  std::optional<ThreadPolicy> thread_policy;  ///< where threads go (none: "auto", the model's own)
  Precision precision = Precision::kFp32;
  PrecisionOptions precision_options;         ///< the scaler's and the master weights' options
  double clip = 0;                            ///< global gradient-norm clip (0: off)
  int64_t accum = 1;                          ///< batches per optimizer step
  bool wd_bn_bias = false;                    ///< decay norm parameters and biases too (fastai's default: no)
  OptimizerSettings opt;                      ///< --opt and its knobs (NaN: fastai's default for the kind)
  int64_t save_every = 0;                     ///< epochs between checkpoints (0: only on interrupt)
  int64_t save_every_steps = 0;               ///< training steps between checkpoints too (0: none)
  int64_t keep = 0;                           ///< checkpoints kept (0: all)
  int64_t max_bad_steps = 10;                 ///< with loss scaling: consecutive NaN/inf losses tolerated
  c10::ScalarType comm_dtype = c10::ScalarType::Float;  ///< data parallel: dtype gradients travel in (Float or Half)
  int ranks = 1;                              ///< data-parallel ranks the run was trained by
  std::string monitor = "valid_loss";         ///< what save_best and early_stop follow
  bool save_best = false;                     ///< keep the best epoch's model and end with it
  int64_t early_stop = -1;                    ///< patience in epochs (-1: off)
  std::string split_at;                       ///< parameter groups start at these names ("a,b"; empty: one group)
  int64_t freeze_to = 0;                      ///< groups before this one do not train

  /// Every stored option of the table as a JSON object (args.json's text).
  std::string to_json() const;
  /// The inverse of to_json(). A field absent from an older file takes its
  /// default; a missing first-release field, an unknown field or a mistyped one
  /// throws c10::Error naming it.
  static RunConfig from_json(const std::string& text);
  /// Writes `dir`/args.json atomically.
  void write(const std::string& dir) const;
  /// Reads `dir`/args.json; throws c10::Error naming the problem ("damaged" only
  /// for a file that is not JSON).
  static RunConfig read(const std::string& dir);
};

} // namespace mixtrain::run

namespace mixtrain {
using run::RunConfig;
} // namespace mixtrain
