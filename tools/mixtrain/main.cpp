// mixtrain: the command-line tool. It parses flags, builds a Learner and calls
// the library; the training logic lives in libmixtrain.
#include <mixtrain/mixtrain.h>

#include "launch.h"

#include <CLI/CLI.hpp>
#include <zlib.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <atomic>
#include <csignal>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

constexpr int kExitError = 2;

/// A user error: printed as one line, exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TrainArgs {
  std::string data = mixtrain::data::kFashionMnistDir;
  std::string model = "cnn";
  int64_t epochs = 1;
  double lr = 3e-3;
  int64_t bs = 256;
  uint64_t seed = 42;
  int64_t limit = -1;  // -1: all training images
  int threads = 0;     // 0: all cores
  std::string out;     // empty: runs/<timestamp>
  std::string precision = "fp32";
  mixtrain::amp::GradScalerOptions scaler;  // fp16 only
  double clip = 0;    // 0: no clipping
  int64_t accum = 1;  // batches per optimizer step
  bool no_emulation = false;  // fp16 on CPU: error instead of emulation
  mixtrain::amp::MasterWeightsOptions master;  // fp16-master / bf16-master only
  int64_t save_every = 0;       // epochs between checkpoints (0: only on interrupt)
  int64_t keep = 0;             // checkpoints kept (0: all)
  std::string resume;           // run directory to continue
  bool force = false;           // reuse an --out that holds checkpoints
  int64_t interrupt_at_step = -1;  // testing: raise SIGINT after this training step
  int64_t max_bad_steps = 10;  // with loss scaling: consecutive NaN/inf losses tolerated
  std::string comm_dtype = "fp32";  // data parallel: dtype gradients travel in
  int64_t abort_at_step = -1;            // testing: the last rank aborts after this step
  int64_t inject_overflow_at_step = -1;  // testing: the last rank's gradients get an inf at this step
};

// ---- Interrupts: the first SIGINT/SIGTERM asks for a checkpoint after the
// current batch; a second one exits at once.
std::atomic<bool> g_stop_requested{false};
std::atomic<bool> g_stop_agreed{false};  // data parallel: the request, agreed by all ranks

extern "C" void on_stop_signal(int) {
  if (g_stop_requested.exchange(true)) ::_exit(mixtrain_cli::kExitInterrupted);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

/// Testing aid behind --interrupt-at-step: delivers a real SIGINT to this process
/// after the given training step, so the interrupt path runs deterministically.
struct RaiseSigintAt : mixtrain::Callback {
  int64_t step;
  explicit RaiseSigintAt(int64_t s) : step(s) { order = 85; }  // before the Checkpointer (90)
  void after_batch(mixtrain::Learner& l) override {
    if (l.training() && l.train_iter() == step) std::raise(SIGINT);
  }
};

/// Testing aid behind --abort-at-step: the process dies as a crashed rank would.
struct AbortAt : mixtrain::Callback {
  int64_t step;
  explicit AbortAt(int64_t s) : step(s) {}
  void after_batch(mixtrain::Learner& l) override {
    if (l.training() && l.train_iter() == step) std::abort();
  }
};

/// Testing aid behind --inject-overflow-at-step: an inf in this rank's gradients
/// after the all-reduce, so only this rank's found_inf sees it.
struct InjectOverflowAt : mixtrain::Callback {
  int64_t step;
  explicit InjectOverflowAt(int64_t s) : step(s) { order = 2; }  // after DataParallel (1), before the scaler
  void after_backward(mixtrain::Learner& l) override {
    if (l.train_iter() == step) l.model().module().parameters()[0].grad().view(-1)[0] = INFINITY;
  }
};

uint32_t parameter_crc32(mixtrain::Learner& learn) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& t : learn.model().state_tensors()) {
    const torch::Tensor c = t.contiguous();
    crc = crc32(crc, static_cast<const Bytef*>(c.data_ptr()), static_cast<uInt>(c.nbytes()));
  }
  return static_cast<uint32_t>(crc);
}

// ---- The run's own flags, kept in OUT/args.json so that --resume needs nothing else.
nlohmann::json args_to_json(const TrainArgs& a) {
  return {{"data", a.data}, {"model", a.model}, {"epochs", a.epochs}, {"lr", a.lr}, {"bs", a.bs}, {"seed", a.seed},
          {"limit", a.limit}, {"threads", a.threads}, {"precision", a.precision},
          {"init_scale", a.scaler.init_scale()}, {"growth_factor", a.scaler.growth_factor()},
          {"backoff_factor", a.scaler.backoff_factor()}, {"growth_interval", a.scaler.growth_interval()},
          {"clip", a.clip}, {"accum", a.accum}, {"no_emulation", a.no_emulation},
          {"loss_scale", a.master.loss_scale()}, {"dynamic", a.master.dynamic()},
          {"max_noskip", a.master.max_noskip()}, {"max_scale", a.master.max_scale()},
          {"flat_master", a.master.flat_master()}, {"save_every", a.save_every}, {"keep", a.keep},
          {"max_bad_steps", a.max_bad_steps}, {"comm_dtype", a.comm_dtype}};
}

TrainArgs args_from_run_dir(const std::string& dir) {
  const std::string path = dir + "/args.json";
  std::ifstream f(path);
  if (!f) throw UsageError("cannot resume " + dir + ": " + path + " not found (is it a mixtrain run directory?)");
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    TrainArgs a;
    a.data = j.at("data").get<std::string>();
    a.model = j.at("model").get<std::string>();
    a.epochs = j.at("epochs").get<int64_t>();
    a.lr = j.at("lr").get<double>();
    a.bs = j.at("bs").get<int64_t>();
    a.seed = j.at("seed").get<uint64_t>();
    a.limit = j.at("limit").get<int64_t>();
    a.threads = j.at("threads").get<int>();
    a.precision = j.at("precision").get<std::string>();
    a.scaler.init_scale(j.at("init_scale").get<double>())
        .growth_factor(j.at("growth_factor").get<double>())
        .backoff_factor(j.at("backoff_factor").get<double>())
        .growth_interval(j.at("growth_interval").get<int64_t>());
    a.clip = j.at("clip").get<double>();
    a.accum = j.at("accum").get<int64_t>();
    a.no_emulation = j.at("no_emulation").get<bool>();
    a.master.loss_scale(j.at("loss_scale").get<double>())
        .dynamic(j.at("dynamic").get<bool>())
        .max_noskip(j.at("max_noskip").get<int64_t>())
        .max_scale(j.at("max_scale").get<double>())
        .flat_master(j.at("flat_master").get<bool>());
    a.save_every = j.at("save_every").get<int64_t>();
    a.keep = j.at("keep").get<int64_t>();
    a.max_bad_steps = j.at("max_bad_steps").get<int64_t>();
    a.comm_dtype = j.value("comm_dtype", std::string("fp32"));
    a.out = dir;
    a.resume = dir;
    return a;
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("cannot resume " + dir + ": " + path + " is damaged (" + e.what() + ")");
  }
}

bool holds_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "latest", ec)) return true;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind("checkpoint-", 0) == 0) return true;
  return false;
}

std::string format_number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

void add_train_flags(CLI::App& cmd, TrainArgs& a) {
  cmd.add_option("--data", a.data, "Directory with Fashion-MNIST's four idx .gz files")->capture_default_str();
  cmd.add_option("--model", a.model, "Model: cnn (2 conv+BN layers) or mlp (784-256-10)")->capture_default_str();
  cmd.add_option("--epochs", a.epochs, "Epochs to train (>= 1)")->capture_default_str();
  cmd.add_option("--lr", a.lr, "Peak learning rate of the one-cycle schedule (> 0)")->capture_default_str();
  cmd.add_option("--bs", a.bs, "Batch size (>= 1)")->capture_default_str();
  cmd.add_option("--seed", a.seed, "Seed for weights and data order; same seed + threads = same result")
      ->capture_default_str();
  cmd.add_option("--limit", a.limit, "Train on the first N training images only (>= 1; default: all 60000)");
  cmd.add_option("--threads", a.threads,
                 "Intra-op threads (>= 1; default 0 = all cores, OpenBLAS pinned to 1 thread)")
      ->capture_default_str();
  cmd.add_option("--out", a.out, "Run directory for metrics.csv, steps.csv, summary.json (default: runs/<timestamp>)");
  cmd.add_option("--precision", a.precision,
                 "Training precision: fp32, fp16 (autocast + dynamic loss scaling; emulated on CPU), "
                 "bf16 (autocast, no scaler), bf16-master / fp16-master (model stored in bf16/fp16, "
                 "fp32 master weights, norm layers fp32)")
      ->capture_default_str();
  cmd.add_option_function<double>("--init-scale", [&a](double v) { a.scaler.init_scale(v); },
                                  "fp16: initial loss scale (default 65536)");
  cmd.add_option_function<double>("--growth-factor", [&a](double v) { a.scaler.growth_factor(v); },
                                  "fp16: scale multiplier after growth-interval clean steps (default 2)");
  cmd.add_option_function<double>("--backoff-factor", [&a](double v) { a.scaler.backoff_factor(v); },
                                  "fp16: scale multiplier on overflow (default 0.5)");
  cmd.add_option_function<int64_t>("--growth-interval", [&a](int64_t v) { a.scaler.growth_interval(v); },
                                   "fp16: clean steps before the scale grows (default 2000)");
  cmd.add_option_function<double>("--loss-scale", [&a](double v) { a.master.loss_scale(v).dynamic(false); },
                                  "fp16-master/bf16-master: a static loss scale X (default: dynamic from 65536)");
  cmd.add_option_function<int64_t>("--max-noskip", [&a](int64_t v) { a.master.max_noskip(v); },
                                   "fp16-master/bf16-master: clean steps before the scale doubles (default 1000)");
  cmd.add_option_function<double>("--max-scale", [&a](double v) { a.master.max_scale(v); },
                                  "fp16-master/bf16-master: the scale never grows past X (default 16777216)");
  cmd.add_flag_function("--flat-master", [&a](int64_t) { a.master.flat_master(true); },
                        "fp16-master/bf16-master: one contiguous fp32 master buffer per param group");
  cmd.add_option("--save-every", a.save_every, "Save a checkpoint every N epochs and after the last (default 0: only on Ctrl-C)");
  cmd.add_option("--keep", a.keep, "Keep only the newest K checkpoints (default 0: all)");
  cmd.add_option("--resume", a.resume,
                 "Continue the run in OUT_DIR from its latest checkpoint, with the run's own flags (OUT_DIR/args.json)");
  cmd.add_flag("--force", a.force, "Start a new run in an --out directory that already holds checkpoints");
  cmd.add_option("--max-bad-steps", a.max_bad_steps,
                 "With loss scaling (fp16, *-master): stop after more than N consecutive NaN/inf losses "
                 "(fp32/bf16 stop at the first)")
      ->capture_default_str();
  cmd.add_option("--interrupt-at-step", a.interrupt_at_step)->group("");  // testing aid, hidden from --help
  cmd.add_option("--abort-at-step", a.abort_at_step)->group("");
  cmd.add_option("--inject-overflow-at-step", a.inject_overflow_at_step)->group("");
  cmd.add_option("--comm-dtype", a.comm_dtype,
                 "Data parallel (under mixtrain launch / torchrun): dtype gradients travel in, fp32 or fp16 (half the traffic)")
      ->capture_default_str();
  cmd.add_flag("--no-emulation", a.no_emulation,
               "fp16 on CPU: fail instead of emulating fp16 numerics (emulation checks fp16 safety; no speed-up)");
  cmd.add_option("--clip", a.clip, "Clip the global gradient norm to X (after unscaling; default: off)");
  cmd.add_option("--accum", a.accum, "Accumulate gradients over N batches per optimizer step (default 1)")
      ->capture_default_str();
}

/// `check_precision`: false for doctor, where an unsupported precision is a verdict, not a flag error.
void validate(const TrainArgs& a, bool check_precision = true) {
  if (!(a.lr > 0) || !std::isfinite(a.lr)) throw UsageError("invalid --lr " + format_number(a.lr) + ": must be > 0");
  if (a.bs < 1) throw UsageError("invalid --bs " + std::to_string(a.bs) + ": must be >= 1");
  if (a.epochs < 1) throw UsageError("invalid --epochs " + std::to_string(a.epochs) + ": must be >= 1");
  if (a.limit == 0 || a.limit < -1) throw UsageError("invalid --limit " + std::to_string(a.limit) + ": must be >= 1");
  if (a.threads < 0) throw UsageError("invalid --threads " + std::to_string(a.threads) + ": must be >= 1");
  if (a.model != "cnn" && a.model != "mlp") throw UsageError("unknown --model '" + a.model + "' (choices: cnn, mlp)");
  const bool master = a.precision == "fp16-master" || a.precision == "bf16-master";
  if (a.precision != "fp32" && a.precision != "fp16" && a.precision != "bf16" && !master)
    throw UsageError("unsupported --precision '" + a.precision +
                     "' (available: fp32, fp16, bf16, fp16-master, bf16-master)");
  if (a.master.loss_scale() < 0 || !std::isfinite(a.master.loss_scale()))
    throw UsageError("invalid --loss-scale " + format_number(a.master.loss_scale()) + ": must be > 0");
  if (a.master.max_noskip() < 1)
    throw UsageError("invalid --max-noskip " + std::to_string(a.master.max_noskip()) + ": must be >= 1");
  if (!(a.master.max_scale() >= 1))
    throw UsageError("invalid --max-scale " + format_number(a.master.max_scale()) + ": must be >= 1");
  // The CLI trains on CPU, where libtorch has no half matmul.
  if (a.precision == "fp16-master")
    throw UsageError("--precision fp16-master needs CUDA (libtorch has no CPU half matmul); "
                     "use --precision bf16-master, or the emulated --precision fp16");
  if (a.clip < 0 || !std::isfinite(a.clip)) throw UsageError("invalid --clip " + format_number(a.clip) + ": must be > 0");
  if (a.accum < 1) throw UsageError("invalid --accum " + std::to_string(a.accum) + ": must be >= 1");
  if (a.save_every < 0) throw UsageError("invalid --save-every " + std::to_string(a.save_every) + ": must be >= 0");
  if (a.keep < 0) throw UsageError("invalid --keep " + std::to_string(a.keep) + ": must be >= 0");
  if (a.comm_dtype != "fp32" && a.comm_dtype != "fp16")
    throw UsageError("invalid --comm-dtype '" + a.comm_dtype + "' (choices: fp32, fp16)");
  if (a.max_bad_steps < 0)
    throw UsageError("invalid --max-bad-steps " + std::to_string(a.max_bad_steps) + ": must be >= 0");
  // The scaler and the precision check throw c10::Error; main() reports those as
  // one-line flag errors like UsageError, before any work is done.
  mixtrain::amp::GradScaler check_scaler_options(a.scaler);
  if (check_precision && (a.precision == "fp16" || a.precision == "bf16"))
    mixtrain::amp::check_precision_supported(a.precision == "fp16" ? torch::kHalf : torch::kBFloat16, torch::kCPU,
                                             !a.no_emulation);
  if (!fs::is_directory(a.data)) throw UsageError("data directory not found: " + a.data);
}

/// Creates the run directory and proves it is writable before any training starts.
void prepare_out_dir(const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    throw UsageError("cannot create --out directory " + out + ": " + (ec ? ec.message() : "not a directory"));
  const fs::path probe = fs::path(out) / ".mixtrain-write-test";
  {
    std::ofstream f(probe);
    if (!f || !(f << "ok") || !f.flush()) throw UsageError("--out directory " + out + " is not writable");
  }
  fs::remove(probe, ec);
}

/// Loads the training split the flags ask for; data problems are one-line errors.
mixtrain::data::DatasetSplit load_split(const TrainArgs& a) {
  auto split = mixtrain::data::fashion_mnist(a.data);
  if (a.limit > 0) split.train = split.train.head(a.limit);
  if (split.train.size() < a.bs)
    throw UsageError("the training set (" + std::to_string(split.train.size()) + " images) is smaller than --bs " +
                     std::to_string(a.bs));
  return split;
}

/// The Learner train and doctor share: the model, data, loss and accuracy the
/// flags name, with gradient clipping and accumulation when asked for.
std::unique_ptr<mixtrain::Learner> build_learner(const TrainArgs& a, const mixtrain::data::DatasetSplit& split,
                                                 bool progress) {
  auto learn = std::make_unique<mixtrain::Learner>(
      mixtrain::models::by_name(a.model), mixtrain::data::DataLoaders::from_split(split, a.bs, a.seed),
      mixtrain::cross_entropy(), mixtrain::LearnerOptions().metrics({mixtrain::accuracy()}).progress(progress));
  // Orders 20 and 5: they run after / before the precision callbacks added later, whatever the insertion order.
  if (a.clip > 0) learn->add_cb(std::make_shared<mixtrain::callbacks::GradientClip>(a.clip));
  if (a.accum > 1) learn->add_cb(std::make_shared<mixtrain::callbacks::GradientAccumulation>(a.accum));
  return learn;
}

int run_train(TrainArgs a) {
  validate(a);
  const int threads = mixtrain::configure_threads(a.threads);
  torch::manual_seed(a.seed);
  // Under mixtrain launch, torchrun or any launcher exporting torchrun's variables:
  // one rank of a data-parallel job. Only rank 0 writes files.
  const mixtrain::distributed::Env env = mixtrain::distributed::env_from_environment();
  const bool writer = env.rank == 0;

  // Data problems are reported before the run directory is created.
  const auto split = load_split(a);
  std::string checkpoint;
  if (!a.resume.empty()) {
    checkpoint = mixtrain::callbacks::Checkpointer::latest(a.out);
    if (checkpoint.empty()) throw UsageError("cannot resume " + a.out + ": it holds no checkpoint (no " + a.out + "/latest)");
  } else if (writer) {
    if (a.out.empty()) a.out = "runs/" + timestamp();
    if (holds_checkpoint(a.out) && !a.force)
      throw UsageError("--out " + a.out + " already holds checkpoints; continue it with --resume " + a.out +
                       ", or pass --force to start over there");
    prepare_out_dir(a.out);
    mixtrain::write_file_atomically(a.out + "/args.json", args_to_json(a).dump(2) + "\n");
  }

  std::shared_ptr<mixtrain::distributed::ProcessGroup> group;
  if (env.active()) group = mixtrain::distributed::ProcessGroup::connect(env);

  const std::unique_ptr<mixtrain::Learner> learner = build_learner(a, split, writer);
  mixtrain::Learner& learn = *learner;
  std::shared_ptr<mixtrain::callbacks::DataParallel> data_parallel;
  if (group) {
    data_parallel = std::make_shared<mixtrain::callbacks::DataParallel>(
        group, mixtrain::callbacks::DataParallelOptions()
                   .comm_dtype(a.comm_dtype == "fp16" ? torch::kHalf : torch::kFloat)
                   .stop_request(&g_stop_requested)
                   .stop_agreed(&g_stop_agreed));
    learn.add_cb(data_parallel);
  }
  if (a.precision == "fp16") learn.to_fp16(a.scaler, !a.no_emulation);
  if (a.precision == "bf16") learn.to_bf16();
  if (a.precision == "bf16-master") learn.to_half(a.master.dtype(torch::kBFloat16));
  // Data-parallel ranks stop on the agreed request, at the same batch on every rank.
  auto checkpointer = std::make_shared<mixtrain::callbacks::Checkpointer>(
      a.out, a.save_every, a.keep, group ? &g_stop_agreed : &g_stop_requested, writer);
  learn.add_cb(checkpointer);
  // Testing aids act on the last rank only: the others must learn of it through the group.
  const bool last_rank = env.rank == env.world_size - 1;
  if (a.interrupt_at_step >= 0 && last_rank) learn.add_cb(std::make_shared<RaiseSigintAt>(a.interrupt_at_step));
  auto nan_stop = std::make_shared<mixtrain::callbacks::TerminateOnNaN>(a.max_bad_steps, checkpointer);
  learn.add_cb(nan_stop);
  if (!checkpoint.empty()) {
    learn.load(checkpoint);
    std::cout << "mixtrain train: resuming " << a.out << " from " << checkpoint << std::endl;
  }
  if (a.abort_at_step >= 0 && last_rank) learn.add_cb(std::make_shared<AbortAt>(a.abort_at_step));
  if (a.inject_overflow_at_step >= 0 && last_rank)
    learn.add_cb(std::make_shared<InjectOverflowAt>(a.inject_overflow_at_step));
  if (writer) learn.add_cb(std::make_shared<mixtrain::callbacks::CSVLogger>(a.out));
  auto summary = std::make_shared<mixtrain::callbacks::SummaryWriter>(
      a.out + "/summary.json",
      std::map<std::string, std::string>{{"precision", a.precision}, {"model", a.model}},
      std::map<std::string, double>{{"threads", threads},
                                    {"seed", static_cast<double>(a.seed)},
                                    {"batch_size", static_cast<double>(a.bs)},
                                    {"lr", a.lr},
                                    {"train_samples", static_cast<double>(split.train.size())}},
      // The CLI trains on CPU, where fp16 is always emulated.
      std::map<std::string, bool>{{"emulated", a.precision == "fp16"}});
  if (auto mw = learn.get_cb<mixtrain::amp::MasterWeights>()) {
    // Measured after fit, when the gradients exist: what master weights cost.
    summary->add_late_numbers([mw] {
      const auto mem = mw->memory();
      return std::map<std::string, double>{{"param_bytes_model", static_cast<double>(mem.model)},
                                           {"param_bytes_master", static_cast<double>(mem.masters)},
                                           {"param_bytes_grads", static_cast<double>(mem.grads)}};
    });
  }
  if (writer) learn.add_cb(summary);

  if (writer)
    std::cout << "mixtrain train: model " << a.model << ", " << split.train.size() << " train / "
            << split.valid.size() << " valid images, " << a.epochs << " epoch(s), lr " << a.lr << ", bs " << a.bs
            << ", precision " << a.precision << ", " << threads << " thread(s)"
            << (group ? ", " + std::to_string(env.world_size) + " ranks (--bs per rank)" : std::string()) << std::endl;
  install_stop_handlers();
  learn.fit_one_cycle(a.epochs, a.lr);
  if (checkpointer->interrupted()) {
    // Every rank stopped at the same batch; rank 0 wrote the checkpoint.
    const std::string again = group ? "mixtrain launch --nproc " + std::to_string(env.world_size) + " -- train" : "mixtrain train";
    if (writer)
      std::cerr << "mixtrain: interrupted; checkpoint saved to " << checkpointer->last_path()
                << "; resume with: " << again << " --resume " << a.out << std::endl;
    return mixtrain_cli::kExitInterrupted;
  }
  if (nan_stop->triggered()) {
    std::cerr << "mixtrain: stopped: " << nan_stop->message() << std::endl;
    return 1;
  }

  const auto& last = learn.recorder().values().back();
  if (group) {
    // Lets a person (and the tests) see that every rank ended with the same weights.
    std::printf("rank %d: parameters and buffers crc32 %08x, skipped %lld, gradient all-reduce %.1f ms/step\n", env.rank,
                parameter_crc32(learn), static_cast<long long>(learn.recorder().skipped_steps()),
                1000 * data_parallel->comm_seconds() / std::max<int64_t>(1, data_parallel->comm_steps()));
  }
  if (writer)
    std::printf("valid accuracy %.4f, valid loss %.4f; run written to %s\n", last.metrics.at(0), last.valid_loss,
                a.out.c_str());
  return 0;
}

/// `mixtrain doctor`: seed 000's A/B protocol on the CLI models, a verdict,
/// OUT/diagnosis.json and two SVG charts. Exit 0 healthy, 1 problem found.
int run_doctor(TrainArgs a) {
  validate(a, /*check_precision=*/false);
  if (a.precision != "fp16" && a.precision != "bf16")
    throw UsageError("doctor compares fp32 with fp16 or bf16 autocast; pass --precision fp16 (default) or bf16, not " +
                     a.precision);
  const int threads = mixtrain::configure_threads(a.threads);
  const auto split = load_split(a);
  if (a.out.empty()) a.out = "runs/doctor-" + timestamp();
  prepare_out_dir(a.out);

  int built = 0;
  mixtrain::diagnose::LearnerFactory factory = [&]() {
    std::cout << (built++ == 0 ? "doctor: 1/2 fp32 baseline" : "doctor: 2/2 " + a.precision + " run, same seed, "
                                                                "weights and data order") << std::endl;
    return build_learner(a, split, /*progress=*/true);
  };
  std::cout << "mixtrain doctor: model " << a.model << ", " << split.train.size() << " train images, " << a.epochs
            << " epoch(s), lr " << a.lr << ", bs " << a.bs << ", fp32 vs " << a.precision << ", " << threads
            << " thread(s)" << std::endl;
  const auto d = mixtrain::diagnose::compare(
      factory, mixtrain::diagnose::CompareOptions()
                   .epochs(a.epochs)
                   .lr(a.lr)
                   .dtype(a.precision == "fp16" ? torch::kHalf : torch::kBFloat16)
                   .scaler(a.scaler)
                   .allow_fp16_emulation(!a.no_emulation)
                   .seed(a.seed));

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
  std::cout << "\n" << d.report() << "written:";
  for (const auto& w : written) std::cout << " " << w;
  std::cout << std::endl;
  return d.healthy() ? 0 : 1;
}

/// The one-line error every failure ends with, written in one piece: under
/// mixtrain launch a rank may be stopped at any moment once a peer has failed,
/// and a line written piecewise could be cut after "mixtrain: error: ".
void print_error(const std::string& message) {
  const std::string line = "mixtrain: error: " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

/// First line of an exception message (c10::Error's backtrace is not for users).
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

} // namespace

/// `mixtrain launch --nproc N [--master-port P] [--master-addr A] -- COMMAND...`:
/// parsed by hand because everything after "--" belongs to the ranks.
int run_launch(int argc, char** argv) {
  mixtrain_cli::LaunchOptions o;
  std::vector<std::string> command;
  auto number = [](const std::string& flag, const char* v, int lo, int hi) {
    char* end = nullptr;
    const long n = v ? std::strtol(v, &end, 10) : 0;
    if (!v || *end != '\0' || n < lo || n > hi)
      throw UsageError("invalid " + flag + " '" + (v ? v : "") + "' (expected " + std::to_string(lo) + " to " +
                       std::to_string(hi) + ")");
    return static_cast<int>(n);
  };
  int i = 2;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--") {
      ++i;
      break;
    } else if (arg == "--nproc") {
      o.nproc = number(arg, value, 1, 256);
      ++i;
    } else if (arg == "--master-port") {
      o.master_port = number(arg, value, 1, 65535);
      ++i;
    } else if (arg == "--master-addr") {
      if (!value) throw UsageError("--master-addr needs a value");
      o.master_addr = value;
      ++i;
    } else if (arg == "-h" || arg == "--help") {
      std::cout << "Usage: mixtrain launch --nproc N [--master-port P] [--master-addr A] -- train [train flags]\n"
                   "Runs N local ranks of a data-parallel job (Gloo), each with torchrun's variables RANK,\n"
                   "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; prefixes output with [rank k]; stops all\n"
                   "ranks when one fails and exits with its code. Ctrl-C stops every rank at the same batch;\n"
                   "rank 0 saves a checkpoint and the launch exits 130. --bs is per rank.\n";
      return 0;
    } else {
      throw UsageError("unknown launch flag '" + arg + "' (usage: mixtrain launch --nproc N -- train ...)");
    }
  }
  for (; i < argc; ++i) command.push_back(argv[i]);
  if (command.empty() || command[0] != "train")
    throw UsageError("launch runs 'train': mixtrain launch --nproc N [--master-port P] -- train [flags]");
  return mixtrain_cli::launch("/proc/self/exe", command, o);
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "launch") {
    try {
      return run_launch(argc, argv);
    } catch (const UsageError& e) {
      print_error(e.what());
      return kExitError;
    }
  }
  CLI::App app{"mixtrain: mixed-precision training for libtorch, fastai-style.", "mixtrain"};
  app.require_subcommand(1);
  TrainArgs train_args;
  CLI::App* train = app.add_subcommand("train", "Train a model on Fashion-MNIST with fit_one_cycle");
  add_train_flags(*train, train_args);
  TrainArgs doctor_args;
  doctor_args.precision = "fp16";
  CLI::App* doctor = app.add_subcommand(
      "doctor",
      "Diagnose mixed precision: an fp32 baseline and an fp16 (or bf16) run with the same seed, weights, data "
      "order and schedule; prints a verdict with evidence and fixes, writes OUT/diagnosis.json, loss.svg and "
      "scale.svg. Exit 0 healthy, 1 problem found, 2 error. Takes train's flags");
  add_train_flags(*doctor, doctor_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    print_error(first_line(e.what()) + " (see mixtrain --help)");
    return kExitError;
  }

  try {
    if (train->parsed()) {
      if (!train_args.resume.empty()) {
        // A resumed run uses its own recorded flags; only --threads may differ.
        for (const CLI::Option* opt : train->get_options())
          if (opt->count() > 0 && opt->get_name() != "--resume" && opt->get_name() != "--threads")
            throw UsageError("--resume takes the run's flags from " + train_args.resume + "/args.json; do not pass " +
                             opt->get_name());
        const int threads = train_args.threads;
        const bool threads_given = train->count("--threads") > 0;
        train_args = args_from_run_dir(train_args.resume);
        if (threads_given) train_args.threads = threads;
      }
      return run_train(train_args);
    }
    if (doctor->parsed()) {
      for (const char* flag : {"--resume", "--save-every", "--keep", "--force", "--max-bad-steps", "--interrupt-at-step"})
        if (doctor->count(flag) > 0) throw UsageError(std::string("doctor does not take ") + flag + " (it is a train flag)");
      return run_doctor(doctor_args);
    }
  } catch (const UsageError& e) {
    print_error(e.what());
  } catch (const c10::Error& e) {
    print_error(first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    print_error(first_line(e.what()));
  }
  return kExitError;
}
