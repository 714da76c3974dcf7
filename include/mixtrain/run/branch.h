#pragma once
/// Branching a run: `mixtrain doctor --from RUN_DIR [--at STEP] [--window N]`. The
/// doctor restores one of the run's own checkpoints exactly as --resume does (weights,
/// optimizer state, loss scale, schedule position, data order, random state) and
/// replays a window of the run's training from there, in fp32 and in the run's
/// precision, instead of training both from scratch: its cost is (2 + trials) windows,
/// whatever the run's length.
#include "mixtrain/core/learner.h"
#include "mixtrain/diagnose/diagnosis.h"
#include "mixtrain/run/commands.h"
#include "mixtrain/run/options.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mixtrain::run {

/// Steps replayed when --window is not given (or what the run's schedule has left, if
/// fewer): at least the 8 the verdict's rules need, enough that the smoothed loss (a
/// 0.98 moving average, ~50 steps of memory) reflects the window rather than the steps
/// before it, and that lost updates and the loss scale's backoffs show; small enough
/// that 2 arms and 4 trials stay 600 steps, whatever the run's length.
constexpr int64_t kDefaultWindow = 100;

/// The doctor of RunArgs::from_run: reads RUN_DIR/args.json and a checkpoint (at
/// RunArgs::at, or chosen: the state a stopped run stopped in, else the newest the run
/// went on from for a whole window), shows the run's own record, replays the window
/// (diagnose::compare_branch) and checks the replay against the run's steps.csv
/// (Diagnosis::replay). Writes only into RunArgs::out. Bad input (no args.json, no or a
/// damaged checkpoint, an unknown step, a window too short or past the schedule's end,
/// flags that would change the run) throws OptionError or c10::Error naming it.
diagnose::Diagnosis doctor_from(RunArgs args, const OptionWords& words, const StopFlags& stop);

/// Where `mixtrain train --from RUN_DIR [--at STEP] --out NEW_DIR [flags]` starts.
struct BranchStart {
  std::string from;        ///< the run folder
  std::string checkpoint;  ///< the checkpoint branched from
  int64_t step = 0;        ///< its training step
  RunConfig trained;       ///< the run's own args.json (a data-parallel run's in one process: see one_process)
  /// Non-empty when a run of several ranks goes on in one process, with their global
  /// batch as its batch: what that means, in words.
  std::string one_process;
  /// The run's input files' fingerprints as checked against the checkpoint's record (the new
  /// run records them too; empty for a checkpoint of an older version, which records none).
  std::map<std::string, std::string> inputs;
};
/// For train --from: reads RUN_DIR/args.json and puts on top of it the flags `args` was
/// given that change only how the run computes (the precision and its options, clipping,
/// threads, checkpoints); any other (the model, the data, bs, the schedule) is refused
/// naming it, since it would make another run. `args.config` becomes the new run's.
/// Picks the checkpoint: RunArgs::at, or the newest. Throws OptionError / c10::Error.
BranchStart start_from_run(RunArgs& args);
/// Loads the branch point into `learn` (built for the new run, no precision attached
/// yet): in the run's own precision, exactly as a resume would, then converted to
/// `now`'s precision (run::set_precision), the loss scale carried over where the
/// scaler's settings did not change. The next fit continues the run's schedule.
void restore_branch(Learner& learn, const BranchStart& start, const RunConfig& now);

/// Where a user's own training loop stands (Python's `mixtrain.doctor(model, data,
/// optimizer=opt, scaler=..., steps=N)`): a torch.optim optimizer's param groups and
/// per-parameter state, by the model's parameter names. The weights are the model's; a
/// GradScaler's scale and settings come as the precision options (init_scale, ...).
struct LoopState {
  struct Group {
    std::vector<std::string> params;  ///< names, as the model's named_parameters() says them
    double lr = 0, weight_decay = 0, eps = 1e-8, beta1 = 0.9, beta2 = 0.999;  ///< Adam, AdamW (eps, betas)
    double momentum = 0, dampening = 0;                                       ///< SGD (momentum: RMSprop too)
    bool nesterov = false, amsgrad = false;
    double alpha = 0.99;                                ///< RMSprop
    bool centered = false;                              ///< RMSprop
    double lr_decay = 0, initial_accumulator_value = 0;  ///< Adagrad
  };
  std::string optimizer;  ///< "adamw", "adam", "sgd", "rmsprop" or "adagrad"
  std::vector<Group> groups;
  /// Per parameter name, its state as torch.optim keeps it: "step", "exp_avg",
  /// "exp_avg_sq", "max_exp_avg_sq" (Adam, AdamW); "momentum_buffer" (SGD); "step",
  /// "square_avg", "momentum_buffer", "grad_avg" (RMSprop); "step", "sum" (Adagrad). A
  /// parameter the optimizer has not stepped yet has none.
  std::map<std::string, std::map<std::string, at::Tensor>> state;
  /// The seed of the loop's stochastic rounding: mixtrain.optim's `seed`, or 0 for a
  /// torch.optim optimizer (from_torch's default: what the doctor's cure hands over).
  uint64_t rounding_seed = 0;
};

/// The optimizer the loop was stepping, with its groups and hyperparameters, over
/// `model`'s parameters (found by name): an OptimizerFactory for LearnerOptions. It is
/// mixtrain's (optim/optimizers.h): torch.optim's update, op for op, which is what the
/// loop runs (libtorch's own Adam differs in a few ulps), and what mixtrain.optim runs
/// after the cure.
OptimizerFactory loop_optimizer(const LoopState& loop, const Model& model);

/// The doctor of a training loop's state (RunArgs::loop): the next window of the loop
/// (args' data: the window's batches, in order; its batch size is args' bs) replayed
/// from the model's weights and the optimizer's state, in fp32 and in args' precision,
/// at the optimizer's constant learning rate; then the verdict and trials as
/// doctor_from gives them. Diagnosis::replay says where it started; matches_run is
/// nullopt (a loop records no steps to check the replay against).
diagnose::Diagnosis doctor_from_loop(RunArgs args, const OptionWords& words, const StopFlags& stop);

} // namespace mixtrain::run
