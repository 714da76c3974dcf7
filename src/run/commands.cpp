#include "mixtrain/run/commands.h"
#include "mixtrain/core/precision_modes.h"
#include "mixtrain/run/branch.h"
#include "mixtrain/run/stored_model.h"

#include "mixtrain/amp/fp32_islands.h"
#include "mixtrain/util/atomic_file.h"
#include "mixtrain/callbacks/checkpointer.h"
#include "mixtrain/callbacks/csv_logger.h"
#include "mixtrain/callbacks/data_parallel.h"
#include "mixtrain/callbacks/stop_on_request.h"
#include "mixtrain/callbacks/summary_writer.h"
#include "mixtrain/callbacks/terminate_on_nan.h"
#include "mixtrain/callbacks/tracker.h"
#include "mixtrain/diagnose/compare.h"
#include "mixtrain/diagnose/plots.h"
#include "mixtrain/parallel/distributed.h"
#include "mixtrain/util/option_error.h"
#include "mixtrain/run/learner_builder.h"
#include "mixtrain/run/model_registry.h"
#include "mixtrain/run/run_folder.h"
#include "mixtrain/callbacks/fault_injection.h"
#include "mixtrain/util/threads.h"

#include "run/run_record.h"
#include "util/read_file.h"

#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <optional>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>

namespace mixtrain::run {

namespace {

/// A monitored value the Learner does not have is an error before training starts.
void check_monitor(Learner& learn, const std::string& monitor) {
  const auto choices = callbacks::monitorable_values(learn.recorder());
  if (std::find(choices.begin(), choices.end(), monitor) != choices.end()) return;
  throw OptionError("monitor", "unknown " + Phrase::name("monitor") + " '" + monitor +
                                   "' (choices: " + callbacks::monitorable_list(learn.recorder()) + ")");
}

/// Input files named as they resolve from anywhere: args.json and the run record
/// keep absolute paths, so a resume from another directory reads the same files.
void resolve_input_paths(RunConfig& r) {
  for (std::string* path : {&r.data, &r.model}) {
    std::error_code ec;
    if (!path->empty() && (std::filesystem::is_regular_file(*path, ec) || std::filesystem::is_directory(*path, ec)))
      *path = std::filesystem::absolute(*path, ec).lexically_normal().string();
  }
}

/// The new run's folder: refuses one that holds another run (unless forced), then
/// creates it and records the configuration.
void start_folder(RunArgs& a, int world_size) {
  if (a.out.empty()) a.out = RunFolder::default_path("");
  a.out = RunFolder::resolve(a.out);  // checked as it will be created: OLD/x/.. is OLD
  const RunFolder folder(a.out);
  folder.refuse_unless_forced(a.force);
  folder.prepare();
  folder.clear_finished();
  folder.clear_checkpoints();  // forced: the old run's checkpoints are not this run's to resume from
  RunConfig recorded = a.config;
  recorded.ranks = world_size;
  folder.write_config(recorded);
}

/// "valid accuracy 0.7461, valid loss 0.6930".
std::string metrics_line(const std::vector<std::string>& names, const std::vector<double>& metrics, double valid_loss) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < metrics.size(); ++i) {
    char value[64];
    std::snprintf(value, sizeof(value), "valid %s %.4f, ", names[i].c_str(), metrics[i]);
    out += value;
  }
  char loss[64];
  std::snprintf(loss, sizeof(loss), "valid loss %.4f", valid_loss);
  return out + loss;
}

std::string metrics_line(Learner& learn) {
  const auto& last = learn.recorder().values().back();
  return metrics_line(learn.recorder().metric_names(), last.metrics, last.valid_loss);
}

/// Master weights train a 16-bit copy of the model and validate it, but the run
/// hands back (model.pt, Python's model) the fp32 masters, which round differently.
/// The masters go into the model and are validated in fp32, so the run reports the
/// metrics of what it hands back, next to the trained copy's, each named.
std::string hand_back_masters(Learner& learn, const std::string& dtype, callbacks::SummaryWriter* summary) {
  const std::string trained = metrics_line(learn);
  learn.to_fp32();
  const std::vector<double> v = learn.validate();  // the loss, then the metrics
  const std::vector<std::string> names = learn.recorder().metric_names();
  const std::vector<double> metrics(v.begin() + 1, v.end());
  if (summary) {
    callbacks::NumberFields numbers{{"returned_valid_loss", v.at(0)}};
    for (size_t i = 0; i < names.size() && i < metrics.size(); ++i) numbers["returned_valid_" + names[i]] = metrics[i];
    summary->add({{"returned_weights", "fp32 masters"}}, numbers);
  }
  return metrics_line(names, metrics, v.at(0)) + " (the fp32 master weights handed back; the " + dtype +
         " copy validated in training: " + trained + ")";
}

} // namespace

RunArgs resume_args(const std::string& folder_path, int threads) {
  RunArgs a;
  const RunFolder folder(folder_path);
  try {
    a.config = folder.read_config();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot resume ", folder_path, ": ", e.msg());
  }
  TORCH_CHECK(!folder.finished(), "cannot resume ", folder_path, ": the run finished its ", a.config.epochs,
              " epoch(s); there is nothing to continue");
  if (threads >= 0) a.config.threads = threads;
  a.out = a.resume = folder_path;
  return a;
}



TrainResult train(RunArgs a, const StopFlags& stop) {
  const RunTurn turn;
  // --from: the other run's flags, with the given ones that change how it computes.
  std::optional<BranchStart> branch;
  if (!a.from_run.empty()) branch = start_from_run(a);
  choose_for_model_file(a, Command::kTrain);
  validate(a, Command::kTrain);
  const RunConfig& r = a.config;
  // Under mixtrain launch, torchrun or any launcher exporting torchrun's variables:
  // one rank of a data-parallel job. Only rank 0 writes files.
  const distributed::Env env = distributed::env_from_environment();
  const bool writer = env.rank == 0;
  if (a.resume.empty()) resolve_input_paths(a.config);
  // Read once: checked on a resume, recorded in every checkpoint (a branch read them checking its source).
  const auto inputs = branch && !branch->inputs.empty() ? branch->inputs : input_fingerprints(r);
  const RunStart start = start_run(a, env.world_size);  // data problems come before the run folder
  const int threads = start.threads;
  const data::DatasetSplit& split = start.split;
  std::string checkpoint;
  std::optional<Recorded> trained;  // what the checkpoint resumed from was trained with
  if (!a.resume.empty()) {
    if (r.ranks != env.world_size)
      TORCH_CHECK(false, "cannot resume ", a.out, " with ", env.world_size, " rank(s): it was trained by ", r.ranks,
                  "; resume with: ", train_command(r.ranks), " --resume ", a.out);
    const RunFolder resumed(a.out);
    resumed.prepare();  // writable, and `latest` a file: found now, not at the first checkpoint
    resumed.remove_dead_temp_files();
    checkpoint = resumed.latest_checkpoint();
    TORCH_CHECK(!checkpoint.empty(), "cannot resume ", a.out,
                ": it holds no complete checkpoint (the run stopped before its first one landed); start it again with: ",
                train_command(r.ranks), " --out ", a.out, " and the flags in ", a.out, "/args.json");
    try {
      trained = recorded_run(checkpoint);
    } catch (const c10::Error& e) {
      // A damaged newest checkpoint: an older complete one may be there to resume from.
      const auto all = callbacks::Checkpointer::newest_first(a.out);
      TORCH_CHECK(all.size() < 2, e.msg(), "; the older checkpoint ", all.size() > 1 ? all[1] : "",
                  " may be whole: move the damaged one away and resume again");
      throw;
    }
    if (trained) {
      const SameRunWords words{"cannot resume " + a.out, "its checkpoints were", "a resume continues that run",
                               ", or start a new run with " + Phrase::name("out")};
      check_same_run(trained->config, r, words);
      check_same_inputs(trained->inputs, inputs, r, words);
    }
  }
  // The model, its fit to the data and the precision (fp32 islands name its modules)
  // are checked before the run folder is written.
  const std::unique_ptr<Learner> learner = build_learner(a, split, writer);
  Learner& learn = *learner;
  if (branch)
    restore_branch(learn, *branch, r);  // the branch point, in the new run's precision
  else
    set_precision(learn, r);
  if (a.resume.empty() && writer) start_folder(a, env.world_size);
  const RunFolder folder(a.out);

  std::shared_ptr<distributed::ProcessGroup> group;
  if (env.active())
    group = distributed::ProcessGroup::connect(env, std::chrono::milliseconds(static_cast<int64_t>(a.timeout * 1000)));

  std::shared_ptr<callbacks::DataParallel> data_parallel;
  if (group) {
    data_parallel = std::make_shared<callbacks::DataParallel>(
        group, callbacks::DataParallelOptions()
                   .comm_dtype(r.comm_dtype)
                   .stop_request(stop.requested)
                   .stop_agreed(stop.agreed));
    learn.add_cb(data_parallel);
  }
  // Data-parallel ranks stop on the agreed request, at the same batch on every rank.
  auto checkpointer = std::make_shared<callbacks::Checkpointer>(callbacks::CheckpointerOptions(a.out)
                                                                    .every(r.save_every)
                                                                    .every_steps(r.save_every_steps)
                                                                    .keep(r.keep)
                                                                    .stop(group ? stop.agreed : stop.requested)
                                                                    .armed(stop.armed)
                                                                    .write(writer));
  learn.add_cb(checkpointer);
  add_stop_callbacks(learn, stop, /*keeps_checkpoints=*/true);
  // A checkpoint of an older version holds no run record: its resume goes on without one.
  if (checkpoint.empty() || trained) {
    RunConfig recorded = r;
    recorded.ranks = env.world_size;
    learn.add_cb(std::make_shared<RunRecord>(recorded.to_json(), inputs));
  }
  // Testing aids act on the last rank only: the others must learn of it through the group.
  const bool last_rank = env.rank == env.world_size - 1;
  if (a.interrupt_at_step >= 0 && last_rank) learn.add_cb(std::make_shared<testing::RaiseSigintAt>(a.interrupt_at_step));
  auto nan_stop = std::make_shared<callbacks::TerminateOnNaN>(r.max_bad_steps, checkpointer);
  // A front end's temporary folder goes once the call returns: the state is the model's then.
  if (!a.report_files) nan_stop->hold_state_in("the returned model (its run folder is temporary, so no file)");
  learn.add_cb(nan_stop);
  if (r.save_best || r.early_stop >= 0) check_monitor(learn, r.monitor);
  if (r.save_best) learn.add_cb(std::make_shared<callbacks::SaveModel>(r.monitor));
  if (r.early_stop >= 0) learn.add_cb(std::make_shared<callbacks::EarlyStopping>(r.monitor, 0, r.early_stop));
  if (!checkpoint.empty()) {
    learn.load(checkpoint);
    std::cout << "mixtrain train: resuming " << a.out << " from " << checkpoint << std::endl;
  }
  if (branch && writer)
    std::cout << "mixtrain train: a new run from " << branch->checkpoint << " (step " << branch->step << " of "
              << branch->from << "), precision " << precision_name(r.precision) << std::endl;
  if (branch && writer && !branch->one_process.empty()) std::cout << "mixtrain train: " << branch->one_process << std::endl;
  if (a.abort_at_step >= 0 && last_rank) learn.add_cb(std::make_shared<testing::AbortAt>(a.abort_at_step));
  if (a.inject_overflow_at_step >= 0 && last_rank)
    learn.add_cb(std::make_shared<testing::InjectOverflow>(std::set<int64_t>{a.inject_overflow_at_step}));
  std::shared_ptr<callbacks::SummaryWriter> summary;
  if (writer) {
    learn.add_cb(std::make_shared<callbacks::CSVLogger>(a.out));
    learn.add_cb(summary = std::make_shared<callbacks::SummaryWriter>(
        callbacks::SummaryWriterOptions(folder.file("summary.json"))
            .text({{"model", r.model}})
            .integers({{"threads", threads},
                       {"seed", static_cast<int64_t>(r.seed)},
                       {"batch_size", r.bs},
                       {"train_samples", split.train.size()}})
            .numbers({{"lr", r.lr.last()}})));
    std::cout << "mixtrain train: model " << r.model << ", " << split.train.size() << " train / " << split.valid.size()
              << " valid samples, " << r.epochs << " epoch(s), lr " << r.lr.str() << ", bs " << r.bs << ", precision "
              << precision_name(r.precision) << ", " << threads_words(start)
              << (group ? ", " + std::to_string(env.world_size) + " ranks (--bs per rank)" : std::string()) << std::endl;
    if (!r.split_at.empty()) {
      std::cout << "mixtrain train: " << learn.n_groups() << " parameter groups (split at " << r.split_at
                << "), peak lr per group";
      for (double lr : r.lr.for_groups(learn.n_groups())) std::cout << " " << lr;
      if (learn.frozen_idx() > 0) std::cout << "; groups before " << learn.frozen_idx() << " frozen";
      std::cout << std::endl;
    }
    if (is_sequence_classification(split, r))
      std::cout << "mixtrain train: unigram baseline perplexity " << data::unigram_perplexity(split)
                << " (a model that ignores context)" << std::endl;
  }
  // A file that cannot be written (a full disk) ends the run with what is intact and how to go on.
  const auto write_failed = [&](const FileWriteError& e, const std::string& what) {
    const std::string newest = folder.latest_checkpoint();
    TORCH_CHECK(false, e.msg(), what,
                newest.empty() ? "; no checkpoint has landed yet, so the run starts again from step 0 once there is room"
                               : "; the newest checkpoint " + newest + " is intact: make room, then resume with: " +
                                     train_command(env.world_size) + " --resume " + a.out);
  };
  try {
    learn.fit_one_cycle(r.epochs, r.lr);
  } catch (const FileWriteError& e) {
    write_failed(e, "");
  }

  TrainResult result;
  result.folder = a.out;
  result.world_size = env.world_size;
  result.metric_names = learn.recorder().metric_names();
  result.epochs = learn.recorder().values();
  result.steps = learn.recorder().steps();
  if (summary) result.summary = summary->json();
  if (checkpointer->interrupted()) {
    // Every rank stopped at the same batch; rank 0 wrote the checkpoint.
    result.end = TrainResult::End::kInterrupted;
    result.checkpoint = checkpointer->last_path();
    return result;
  }
  if (nan_stop->triggered()) {
    result.end = TrainResult::End::kStopped;
    result.message = nan_stop->message();
    // Kept with the run: mixtrain doctor --from shows it as the run's own record.
    if (summary) summary->add({{"stopped", result.message.str()}}, {});
    // The charts matter most for the run that stopped: the loss and the scale up to the stop.
    if (writer) {
      try {
        result.charts = folder.write_charts(learn.recorder());
      } catch (const FileWriteError&) {
        // The stop and its checkpoint are what counts; a full disk keeps only the charts out.
      }
    }
    return result;
  }
  if (group)  // lets a person (and the tests) see that every rank ended with the same weights
    std::printf("rank %d: parameters and buffers crc32 %08x, skipped %lld, gradient all-reduce %.1f ms/step\n", env.rank,
                learn.model().state_crc32(), static_cast<long long>(learn.recorder().skipped_steps()),
                1000 * data_parallel->comm_seconds() / std::max<int64_t>(1, data_parallel->comm_steps()));
  const std::string said = uses_master_weights(r.precision)
                               ? hand_back_masters(learn, compute_dtype(r.precision) == torch::kHalf ? "fp16" : "bf16", summary.get())
                               : metrics_line(learn);
  if (summary) result.summary = summary->json();
  if (writer) {
    bool finished = false;
    try {
      folder.write_model(learn.model(), r.model);
      // A finished run is not resumable into a retrain from an older checkpoint.
      folder.mark_finished(r.epochs);
      finished = true;
      result.charts = folder.write_charts(learn.recorder());
    } catch (const FileWriteError& e) {
      // Say what was written: once the run is marked finished there is nothing to resume.
      if (finished)
        TORCH_CHECK(false, e.msg(), " after the run finished: model.pt and its logs are written, only its "
                                    "charts (loss.svg, lr.svg, scale.svg) are not; make room, nothing else is lost");
      write_failed(e, " after the last epoch (model.pt is not written)");
    }
    // Through std::cout, as every other line: a front end that redirects it (Python's
    // sys.stdout, a notebook cell) catches this one too.
    if (a.report_files)
      std::cout << said << "; run written to " << a.out << " (trained model: model.pt)" << std::endl;
    else
      std::cout << said << std::endl;
  }
  return result;
}

LrFindResult lr_find(RunArgs a, const StopFlags& stop) {
  const RunTurn turn;
  choose_for_model_file(a, Command::kLrFind);
  validate(a, Command::kLrFind);
  const RunConfig& r = a.config;
  const RunStart start = start_run(a, /*world_size=*/1);
  const data::DatasetSplit& split = start.split;
  // The model's fit to the data is checked before the folder is created.
  const auto learner = build_learner(a, split, /*progress=*/false);
  // Without the fit warning: the sweep starts at a learning rate that loses bf16 updates by design.
  learner->set_precision(r.precision, PrecisionOptions(r.precision_options).rounding_seed(r.seed));
  if (a.out.empty()) a.out = RunFolder::default_path("lr_find-");
  const RunFolder folder(a.out);
  folder.prepare();
  add_stop_callbacks(*learner, stop, /*keeps_checkpoints=*/false);
  const LrFindOptions& o = a.lr_find;
  const int64_t batches = learner->dls().train.num_batches();
  std::cout << "mixtrain lr_find: model " << r.model << ", lr " << o.start_lr() << " to " << o.end_lr() << " over "
            << o.num_it() << " steps, bs " << r.bs << ", precision " << precision_name(r.precision) << ", "
            << threads_words(start) << std::endl;
  LrFindResult res = learner->lr_find(o);
  if (res.epochs > 1)
    std::cout << "the training set has " << batches << " batches per epoch: the sweep cycled through it " << res.epochs
              << " times (as fastai does)" << std::endl;
  int64_t skipped = 0;
  for (bool s : res.skipped) skipped += s;
  std::cout << res.lrs.size() << " steps" << (res.diverged ? " (stopped: the loss diverged)" : "")
            << (skipped ? ", " + std::to_string(skipped) + " skipped by the loss scaler (marked in the chart)" : "")
            << "\nsuggestions: " << res.summary() << std::endl;
  write_file_atomically(folder.file("lr_find.svg"), res.svg());
  write_file_atomically(folder.file("lr_find.csv"), res.csv());
  if (a.report_files)
    std::cout << "written: " << folder.file("lr_find.svg") << " " << folder.file("lr_find.csv") << std::endl;
  return res;
}

} // namespace mixtrain::run
