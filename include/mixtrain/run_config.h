#pragma once
/// RunConfig: the settings of one training run as `mixtrain train` takes them,
/// and as a run directory keeps them (OUT/args.json), so that `--resume` needs
/// nothing else.

#include "mixtrain/data.h"
#include "mixtrain/param_groups.h"
#include "mixtrain/precision.h"

#include <cstdint>
#include <string>

namespace mixtrain {

struct RunConfig {
  /// Fashion-MNIST's directory, a tensor file (torch.save'd dict), or for the
  /// transformer a text file or directory; empty: the model's own data
  /// (Fashion-MNIST, the transformer's fortunes corpus).
  std::string data;
  std::string model = "cnn";                  ///< built-in model name, or a TorchScript file
  std::string loss = "cross_entropy";         ///< cross_entropy, mse or bce_with_logits
  int64_t epochs = 1;
  Lrs lr = 3e-3;                              ///< peak of the one-cycle schedule, or one per parameter group
  int64_t bs = 256;                           ///< batch size (per rank under data parallelism)
  uint64_t seed = 42;
  int64_t limit = -1;                         ///< first N training samples (-1: all)
  int threads = 0;                            ///< intra-op threads (0: all cores)
  Precision precision = Precision::kFp32;
  PrecisionOptions precision_options;         ///< the scaler's and the master weights' options
  double clip = 0;                            ///< global gradient-norm clip (0: off)
  int64_t accum = 1;                          ///< batches per optimizer step
  bool wd_bn_bias = false;                    ///< decay norm parameters and biases too (fastai's default: no)
  int64_t save_every = 0;                     ///< epochs between checkpoints (0: only on interrupt)
  int64_t keep = 0;                           ///< checkpoints kept (0: all)
  int64_t max_bad_steps = 10;                 ///< with loss scaling: consecutive NaN/inf losses tolerated
  std::string comm_dtype = "fp32";            ///< data parallel: dtype gradients travel in
  int ranks = 1;                              ///< data-parallel ranks the run was trained by
  std::string monitor = "valid_loss";         ///< what --save-best and --early-stop follow
  bool save_best = false;                     ///< keep the best epoch's model and end with it
  int64_t early_stop = -1;                    ///< patience in epochs (-1: off)
  std::string split_at;                       ///< parameter groups start at these names ("a,b"; empty: one group)
  int64_t freeze_to = 0;                      ///< groups before this one do not train

  /// Every field above as a JSON object. One table in run_config.cpp describes the
  /// fields for both directions.
  std::string to_json() const;
  /// The inverse of to_json(); throws c10::Error naming a missing or mistyped
  /// field. Fields added since a run directory was written keep their defaults.
  static RunConfig from_json(const std::string& text);
  /// Writes `dir`/args.json atomically.
  void write(const std::string& dir) const;
  /// Reads `dir`/args.json; throws c10::Error naming the problem (missing file,
  /// damaged JSON, a missing field).
  static RunConfig read(const std::string& dir);
};

} // namespace mixtrain
