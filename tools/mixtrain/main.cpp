// mixtrain: the command-line tool. It maps flags onto the library's options
// (flags.h), builds a Learner and calls the library; the training logic lives
// in libmixtrain.
#include <mixtrain/mixtrain.h>
#include <mixtrain/testing.h>

#include "flags.h"
#include "learner_from_flags.h"
#include "launch.h"

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>
#include <unistd.h>

using namespace mixtrain_cli;

namespace {

// ---- Interrupts: the first SIGINT/SIGTERM asks for a checkpoint after the
// current batch; a second one exits at once.
std::atomic<bool> g_stop_requested{false};
std::atomic<bool> g_stop_agreed{false};  // data parallel: the request, agreed by all ranks

extern "C" void on_stop_signal(int) {
  if (g_stop_requested.exchange(true)) ::_exit(kExitInterrupted);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

/// A monitored value the Learner does not have is a usage error before training starts.
void check_monitor(mixtrain::Learner& learn, const std::string& monitor) {
  const auto choices = mixtrain::callbacks::monitorable_values(learn.recorder());
  if (std::find(choices.begin(), choices.end(), monitor) != choices.end()) return;
  throw UsageError("unknown --monitor '" + monitor + "' (choices: " + mixtrain::callbacks::monitorable_list(learn.recorder()) + ")");
}

/// OUT/loss.svg, OUT/lr.svg and, with a loss scale, OUT/scale.svg.
void write_run_charts(mixtrain::Learner& learn, const std::string& out) {
  mixtrain::write_file_atomically(out + "/loss.svg", mixtrain::diagnose::plot_loss(learn.recorder()));
  mixtrain::write_file_atomically(out + "/lr.svg", mixtrain::diagnose::plot_sched(learn.recorder()));
  const std::string scale = mixtrain::diagnose::plot_scale(learn.recorder());
  if (!scale.empty()) mixtrain::write_file_atomically(out + "/scale.svg", scale);
}

int run_train(TrainArgs a) {
  validate(a, /*check_device=*/true);
  const mixtrain::RunConfig& r = a.run;
  const int threads = mixtrain::configure_threads(r.threads, thread_policy(r));
  torch::manual_seed(r.seed);
  // Under mixtrain launch, torchrun or any launcher exporting torchrun's variables:
  // one rank of a data-parallel job. Only rank 0 writes files.
  const mixtrain::distributed::Env env = mixtrain::distributed::env_from_environment();
  const bool writer = env.rank == 0;

  const auto split = load_split(r, env.world_size);  // data problems are reported before the run directory is created
  std::string checkpoint;
  if (!a.resume.empty()) {
    if (r.ranks != env.world_size)
      throw UsageError("cannot resume " + a.out + " with " + std::to_string(env.world_size) + " rank(s): it was trained by " +
                       std::to_string(r.ranks) + "; resume with: " +
                       (r.ranks > 1 ? "mixtrain launch --nproc " + std::to_string(r.ranks) + " -- train" : std::string("mixtrain train")) +
                       " --resume " + a.out);
    checkpoint = mixtrain::callbacks::Checkpointer::latest(a.out);
    if (checkpoint.empty()) throw UsageError("cannot resume " + a.out + ": it holds no checkpoint (no " + a.out + "/latest)");
  } else if (writer) {
    if (a.out.empty()) a.out = default_run_dir("");
    if (mixtrain::callbacks::Checkpointer::holds_checkpoints(a.out) && !a.force)
      throw UsageError("--out " + a.out +
                       (std::ifstream(a.out + "/finished") ? " holds a finished run"
                                                           : " already holds checkpoints; continue it with --resume " + a.out) +
                       ", or pass --force to start over there");
    prepare_out_dir(a.out);
    std::remove((a.out + "/finished").c_str());  // a new run (--force) in an old run's folder
    mixtrain::RunConfig recorded = r;
    recorded.ranks = env.world_size;
    recorded.write(a.out);
  }

  std::shared_ptr<mixtrain::distributed::ProcessGroup> group;
  if (env.active())
    group = mixtrain::distributed::ProcessGroup::connect(env, std::chrono::milliseconds(static_cast<int64_t>(a.timeout * 1000)));

  const std::unique_ptr<mixtrain::Learner> learner = build_learner(r, split, writer);
  mixtrain::Learner& learn = *learner;
  std::shared_ptr<mixtrain::callbacks::DataParallel> data_parallel;
  if (group) {
    data_parallel = std::make_shared<mixtrain::callbacks::DataParallel>(
        group, mixtrain::callbacks::DataParallelOptions()
                   .comm_dtype(r.comm_dtype == "fp16" ? torch::kHalf : torch::kFloat)
                   .stop_request(&g_stop_requested)
                   .stop_agreed(&g_stop_agreed));
    learn.add_cb(data_parallel);
  }
  learn.set_precision(r.precision, r.precision_options);
  // Data-parallel ranks stop on the agreed request, at the same batch on every rank.
  auto checkpointer = std::make_shared<mixtrain::callbacks::Checkpointer>(
      mixtrain::callbacks::CheckpointerOptions(a.out).every(r.save_every).keep(r.keep).stop(
          group ? &g_stop_agreed : &g_stop_requested).write(writer));
  learn.add_cb(checkpointer);
  // Testing aids act on the last rank only: the others must learn of it through the group.
  const bool last_rank = env.rank == env.world_size - 1;
  if (a.interrupt_at_step >= 0 && last_rank)
    learn.add_cb(std::make_shared<mixtrain::testing::RaiseSigintAt>(a.interrupt_at_step));
  auto nan_stop = std::make_shared<mixtrain::callbacks::TerminateOnNaN>(r.max_bad_steps, checkpointer);
  learn.add_cb(nan_stop);
  if (r.save_best || r.early_stop >= 0) check_monitor(learn, r.monitor);
  if (r.save_best) learn.add_cb(std::make_shared<mixtrain::callbacks::SaveModel>(r.monitor));
  if (r.early_stop >= 0) learn.add_cb(std::make_shared<mixtrain::callbacks::EarlyStopping>(r.monitor, 0, r.early_stop));
  if (!checkpoint.empty()) {
    learn.load(checkpoint);
    std::cout << "mixtrain train: resuming " << a.out << " from " << checkpoint << std::endl;
  }
  if (a.abort_at_step >= 0 && last_rank) learn.add_cb(std::make_shared<mixtrain::testing::AbortAt>(a.abort_at_step));
  if (a.inject_overflow_at_step >= 0 && last_rank)
    learn.add_cb(std::make_shared<mixtrain::testing::InjectOverflow>(std::set<int64_t>{a.inject_overflow_at_step}));
  if (writer) {
    learn.add_cb(std::make_shared<mixtrain::callbacks::CSVLogger>(a.out));
    learn.add_cb(std::make_shared<mixtrain::callbacks::SummaryWriter>(
        mixtrain::callbacks::SummaryWriterOptions(a.out + "/summary.json")
            .text({{"model", r.model}})
            .integers({{"threads", threads},
                       {"seed", static_cast<int64_t>(r.seed)},
                       {"batch_size", r.bs},
                       {"train_samples", split.train.size()}})
            .numbers({{"lr", r.lr.last()}})));
    std::cout << "mixtrain train: model " << r.model << ", " << split.train.size() << " train / "
              << split.valid.size() << " valid samples, " << r.epochs << " epoch(s), lr " << r.lr.str() << ", bs " << r.bs
              << ", precision " << mixtrain::precision_name(r.precision) << ", " << threads << " thread(s)"
              << (group ? ", " + std::to_string(env.world_size) + " ranks (--bs per rank)" : std::string()) << std::endl;
  }
  if (writer && !r.split_at.empty()) {
    std::cout << "mixtrain train: " << learn.n_groups() << " parameter groups (split at " << r.split_at
              << "), peak lr per group";
    for (double lr : r.lr.for_groups(learn.n_groups())) std::cout << " " << lr;
    if (learn.frozen_idx() > 0) std::cout << "; groups before " << learn.frozen_idx() << " frozen";
    std::cout << std::endl;
  }
  if (writer && r.model == "transformer")
    std::cout << "mixtrain train: unigram baseline perplexity " << mixtrain::data::unigram_perplexity(split)
              << " (a character model that ignores context)" << std::endl;
  install_stop_handlers();
  learn.fit_one_cycle(r.epochs, r.lr);
  if (checkpointer->interrupted()) {
    // Every rank stopped at the same batch; rank 0 wrote the checkpoint.
    const std::string again = group ? "mixtrain launch --nproc " + std::to_string(env.world_size) + " -- train" : "mixtrain train";
    if (writer)
      std::cerr << "mixtrain: interrupted; checkpoint saved to " << checkpointer->last_path()
                << "; resume with: " << again << " --resume " << a.out << std::endl;
    return kExitInterrupted;
  }
  if (nan_stop->triggered()) {
    std::cerr << "mixtrain: stopped: " << in_flag_terms(nan_stop->message()) << std::endl;
    return 1;
  }
  const auto& last = learn.recorder().values().back();
  if (group)  // lets a person (and the tests) see that every rank ended with the same weights
    std::printf("rank %d: parameters and buffers crc32 %08x, skipped %lld, gradient all-reduce %.1f ms/step\n", env.rank,
                learn.model().state_crc32(), static_cast<long long>(learn.recorder().skipped_steps()),
                1000 * data_parallel->comm_seconds() / std::max<int64_t>(1, data_parallel->comm_steps()));
  // A finished run is not resumable into a retrain from an older checkpoint.
  if (writer) mixtrain::write_file_atomically(a.out + "/finished", "finished after " + std::to_string(r.epochs) + " epoch(s)\n");
  if (writer) {
    // The trained model, always: TorchScript for a scripted model (torch.jit.load reads it), else the built-in's weights.
    mixtrain::save_model(learn.model(), a.out + "/model.pt", r.model);
    write_run_charts(learn, a.out);
    std::string metrics;
    const auto names = learn.recorder().metric_names();
    for (size_t i = 0; i < names.size() && i < last.metrics.size(); ++i) {
      char value[64];
      std::snprintf(value, sizeof(value), "valid %s %.4f, ", names[i].c_str(), last.metrics[i]);
      metrics += value;
    }
    std::printf("%svalid loss %.4f; run written to %s (trained model: model.pt)\n", metrics.c_str(), last.valid_loss,
                a.out.c_str());
  }
  return 0;
}

/// `mixtrain lr_find`: fastai's learning-rate finder on the model and data the flags
/// name; prints the suggestions, writes OUT/lr_find.svg and OUT/lr_find.csv.
int run_lr_find(TrainArgs a, const mixtrain::LrFindOptions& o) {
  validate(a, /*check_device=*/true);
  const mixtrain::RunConfig& r = a.run;
  const int threads = mixtrain::configure_threads(r.threads, thread_policy(r));
  torch::manual_seed(r.seed);
  const auto split = load_split(r, /*world_size=*/1);
  if (a.out.empty()) a.out = default_run_dir("lr_find-");
  prepare_out_dir(a.out);
  const auto learner = build_learner(r, split, /*progress=*/false);
  learner->set_precision(r.precision, r.precision_options);
  const int64_t batches = learner->dls().train.num_batches();
  std::cout << "mixtrain lr_find: model " << r.model << ", lr " << o.start_lr() << " to " << o.end_lr() << " over "
            << o.num_it() << " steps, bs " << r.bs << ", precision " << mixtrain::precision_name(r.precision) << ", "
            << threads << " thread(s)" << std::endl;
  const mixtrain::LrFindResult res = learner->lr_find(o);
  if (res.epochs > 1)
    std::cout << "the training set has " << batches << " batches per epoch: the sweep cycled through it " << res.epochs
              << " times (as fastai does)" << std::endl;
  int64_t skipped = 0;
  for (bool s : res.skipped) skipped += s;
  std::cout << res.lrs.size() << " steps" << (res.diverged ? " (stopped: the loss diverged)" : "")
            << (skipped ? ", " + std::to_string(skipped) + " skipped by the loss scaler (marked in the chart)" : "")
            << "\nsuggestions: " << res.summary() << std::endl;
  mixtrain::write_file_atomically(a.out + "/lr_find.svg", res.svg());
  mixtrain::write_file_atomically(a.out + "/lr_find.csv", res.csv());
  std::cout << "written: " << a.out << "/lr_find.svg " << a.out << "/lr_find.csv" << std::endl;
  return 0;
}

/// `mixtrain doctor`: the fp32-vs-fp16 comparison protocol on the CLI models, a
/// verdict, OUT/diagnosis.json and two SVG charts. Exit 0 healthy, 1 problem found.
int run_doctor(TrainArgs a) {
  validate(a, /*check_device=*/false);
  const mixtrain::RunConfig& r = a.run;
  if (r.precision != mixtrain::Precision::kFp16 && r.precision != mixtrain::Precision::kBf16)
    throw UsageError("doctor compares fp32 with fp16 or bf16 autocast; pass --precision fp16 (default) or bf16, not " +
                     mixtrain::precision_name(r.precision));
  if (!r.lr.one_for_all())
    throw UsageError("mixtrain doctor takes one --lr, got " + r.lr.str() + " (it trains the model as one parameter group)");
  const bool fp16 = r.precision == mixtrain::Precision::kFp16;
  const int threads = mixtrain::configure_threads(r.threads, thread_policy(r));
  const auto split = load_split(r, /*world_size=*/1);
  if (a.out.empty()) a.out = default_run_dir("doctor-");
  prepare_out_dir(a.out);

  int built = 0;
  mixtrain::diagnose::LearnerFactory factory = [&]() {
    std::cout << (built++ == 0 ? "doctor: 1/2 fp32 baseline"
                               : "doctor: 2/2 " + mixtrain::precision_name(r.precision) + " run, same seed, weights and data order")
              << std::endl;
    return build_learner(r, split, /*progress=*/true);
  };
  std::cout << "mixtrain doctor: model " << r.model << ", " << split.train.size() << " train samples, " << r.epochs
            << " epoch(s), lr " << r.lr.last() << ", bs " << r.bs << ", fp32 vs " << mixtrain::precision_name(r.precision)
            << ", " << threads << " thread(s)" << std::endl;
  const auto d = mixtrain::diagnose::compare(factory, mixtrain::diagnose::CompareOptions()
                                                          .epochs(r.epochs)
                                                          .lr(r.lr.last())
                                                          .dtype(fp16 ? torch::kHalf : torch::kBFloat16)
                                                          .scaler(r.precision_options.scaler())
                                                          .allow_fp16_emulation(r.precision_options.allow_fp16_emulation())
                                                          .seed(r.seed));

  mixtrain::write_file_atomically(a.out + "/diagnosis.json", d.to_json());
  std::vector<std::string> written{a.out + "/diagnosis.json"};
  if (d.evidence.fp32 || d.evidence.mixed) {
    mixtrain::write_file_atomically(a.out + "/loss.svg", mixtrain::diagnose::loss_curves_svg(d.evidence));
    written.push_back(a.out + "/loss.svg");
  }
  if (d.evidence.mixed && d.evidence.mixed->scale.has_scale) {
    mixtrain::write_file_atomically(a.out + "/scale.svg", mixtrain::diagnose::scale_history_svg(*d.evidence.mixed));
    written.push_back(a.out + "/scale.svg");
  }
  std::cout << "\n" << in_flag_terms(d.report()) << "written:";
  for (const auto& w : written) std::cout << " " << w;
  std::cout << std::endl;
  return d.healthy() ? 0 : 1;
}

/// The one-line error every failure ends with, written in one piece: under
/// mixtrain launch a rank may be stopped at any moment once a peer has failed,
/// and a line written piecewise could be cut after "mixtrain: error: ".
void print_error(const std::string& message) {
  const std::string line = "mixtrain: error: " + in_flag_terms(message.substr(0, message.find('\n'))) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"mixtrain: mixed-precision training for libtorch, fastai-style.", "mixtrain"};
  app.require_subcommand(1);
  TrainArgs train_args;
  CLI::App* train = app.add_subcommand("train", "Train a model (built-in or TorchScript) with fit_one_cycle and write OUT/model.pt");
  add_train_flags(*train, train_args);
  TrainArgs doctor_args;
  doctor_args.run.precision = mixtrain::Precision::kFp16;
  CLI::App* doctor = app.add_subcommand(
      "doctor",
      "Diagnose mixed precision: an fp32 baseline and an fp16 (or bf16) run with the same seed, weights, data "
      "order and schedule; prints a verdict with evidence and fixes, writes OUT/diagnosis.json, loss.svg and "
      "scale.svg. Exit 0 healthy, 1 problem found, 2 error");
  add_train_flags(*doctor, doctor_args, /*for_doctor=*/true);
  TrainArgs lr_find_args;
  mixtrain::LrFindOptions lr_find_options;
  CLI::App* lr_find_cmd = app.add_subcommand(
      "lr_find", "fastai's learning-rate finder: sweeps the lr from --start-lr to --end-lr over --num-it steps, prints "
                 "the suggestions (valley, steep, minimum/10), writes OUT/lr_find.svg and OUT/lr_find.csv");
  add_train_flags(*lr_find_cmd, lr_find_args, /*for_doctor=*/true);
  lr_find_cmd->add_option_function<double>("--start-lr", [&](double v) { lr_find_options.start_lr(v); },
                                           "First learning rate (default 1e-7)");
  lr_find_cmd->add_option_function<double>("--end-lr", [&](double v) { lr_find_options.end_lr(v); },
                                           "Last learning rate (default 10)");
  lr_find_cmd->add_option_function<int64_t>("--num-it", [&](int64_t v) { lr_find_options.num_it(v); },
                                            "Steps of the sweep (default 100)");
  LaunchOptions launch_options;
  CLI::App* launch_cmd = add_launch_subcommand(app, launch_options);

  // `launch ... -- COMMAND`: CLI11 parses launch's own flags; everything after "--"
  // is the ranks' command, kept out of CLI11's hands.
  std::vector<std::string> command;
  int cli_argc = argc;
  if (argc > 1 && std::string(argv[1]) == "launch")
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "--") {
        command.assign(argv + i + 1, argv + argc);
        cli_argc = i;
        break;
      }

  try {
    app.parse(cli_argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    print_error(std::string(e.what()) + " (see mixtrain --help)");
    return kExitError;
  }

  try {
    if (launch_cmd->parsed()) {
      check_launch(launch_options, command);
      return launch("/proc/self/exe", command, launch_options);
    }
    if (train->parsed()) {
      if (!train_args.resume.empty()) {
        // A resumed run uses its own recorded flags; only --threads may differ.
        for (const CLI::Option* opt : train->get_options())
          if (opt->count() > 0 && opt->get_name() != "--resume" && opt->get_name() != "--threads")
            throw UsageError("--resume takes the run's flags from " + train_args.resume + "/args.json; do not pass " +
                             opt->get_name());
        const int threads = train_args.run.threads;
        const bool threads_given = train->count("--threads") > 0;
        try {
          train_args.run = mixtrain::RunConfig::read(train_args.resume);
        } catch (const c10::Error& e) {
          throw UsageError("cannot resume " + train_args.resume + ": " + e.msg());
        }
        train_args.out = train_args.resume;
        if (std::ifstream(train_args.out + "/finished"))  // checked first: nothing else needs to run
          throw UsageError("cannot resume " + train_args.out + ": the run finished its " +
                           std::to_string(train_args.run.epochs) + " epoch(s); there is nothing to continue");
        if (threads_given) train_args.run.threads = threads;
      } else {
        for (const auto& w : ignored_flag_warnings(*train, train_args.run, static_cast<int>(std::thread::hardware_concurrency())))
          std::cerr << "mixtrain: warning: " << w << std::endl;
      }
      return run_train(train_args);
    }
    if (lr_find_cmd->parsed()) return run_lr_find(lr_find_args, lr_find_options);
    if (doctor->parsed()) {
      for (const auto& w : ignored_flag_warnings(*doctor, doctor_args.run, static_cast<int>(std::thread::hardware_concurrency())))
        std::cerr << "mixtrain: warning: " << w << std::endl;
      return run_doctor(doctor_args);
    }
  } catch (const UsageError& e) {
    print_error(e.what());
  } catch (const c10::Error& e) {
    print_error(e.what_without_backtrace());
  } catch (const std::exception& e) {
    print_error(e.what());
  }
  return kExitError;
}
