// mixtrain: the command-line tool. It parses flags, builds a Learner and calls
// the library; the training logic lives in libmixtrain.
#include <mixtrain/mixtrain.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

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
};

/// A user error: printed as one line, exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
  cmd.add_flag("--no-emulation", a.no_emulation,
               "fp16 on CPU: fail instead of emulating fp16 numerics (emulation checks fp16 safety; no speed-up)");
  cmd.add_option("--clip", a.clip, "Clip the global gradient norm to X (after unscaling; default: off)");
  cmd.add_option("--accum", a.accum, "Accumulate gradients over N batches per optimizer step (default 1)")
      ->capture_default_str();
}

void validate(const TrainArgs& a) {
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
  // The scaler and the precision check throw c10::Error; main() reports those as
  // one-line flag errors like UsageError, before any work is done.
  mixtrain::amp::GradScaler check_scaler_options(a.scaler);
  if (a.precision == "fp16" || a.precision == "bf16")
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

int run_train(TrainArgs a) {
  validate(a);
  const int threads = mixtrain::configure_threads(a.threads);
  torch::manual_seed(a.seed);

  // Data problems are reported before the run directory is created.
  auto split = mixtrain::data::fashion_mnist(a.data);
  if (a.limit > 0) split.train = split.train.head(a.limit);
  if (split.train.size() < a.bs)
    throw UsageError("the training set (" + std::to_string(split.train.size()) + " images) is smaller than --bs " +
                     std::to_string(a.bs));
  if (a.out.empty()) a.out = "runs/" + timestamp();
  prepare_out_dir(a.out);

  mixtrain::Learner learn(mixtrain::models::by_name(a.model),
                          mixtrain::data::DataLoaders::from_split(split, a.bs, a.seed), mixtrain::cross_entropy(),
                          mixtrain::LearnerOptions().metrics({mixtrain::accuracy()}));
  if (a.precision == "fp16") learn.to_fp16(a.scaler, !a.no_emulation);
  if (a.precision == "bf16") learn.to_bf16();
  if (a.precision == "bf16-master") learn.to_half(a.master.dtype(torch::kBFloat16));

  if (a.clip > 0) learn.add_cb(std::make_shared<mixtrain::callbacks::GradientClip>(a.clip));
  if (a.accum > 1) learn.add_cb(std::make_shared<mixtrain::callbacks::GradientAccumulation>(a.accum));
  learn.add_cb(std::make_shared<mixtrain::callbacks::CSVLogger>(a.out));
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
  learn.add_cb(summary);

  std::cout << "mixtrain train: model " << a.model << ", " << split.train.size() << " train / "
            << split.valid.size() << " valid images, " << a.epochs << " epoch(s), lr " << a.lr << ", bs " << a.bs
            << ", precision " << a.precision << ", " << threads << " thread(s)" << std::endl;
  learn.fit_one_cycle(a.epochs, a.lr);

  const auto& last = learn.recorder().values().back();
  std::printf("valid accuracy %.4f, valid loss %.4f; run written to %s\n", last.metrics.at(0), last.valid_loss,
              a.out.c_str());
  return 0;
}

/// First line of an exception message (c10::Error's backtrace is not for users).
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"mixtrain: mixed-precision training for libtorch, fastai-style.", "mixtrain"};
  app.require_subcommand(1);
  TrainArgs train_args;
  CLI::App* train = app.add_subcommand("train", "Train a model on Fashion-MNIST with fit_one_cycle");
  add_train_flags(*train, train_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "mixtrain: error: " << first_line(e.what()) << " (see mixtrain --help)" << std::endl;
    return kExitError;
  }

  try {
    if (train->parsed()) return run_train(train_args);
  } catch (const UsageError& e) {
    std::cerr << "mixtrain: error: " << e.what() << std::endl;
  } catch (const c10::Error& e) {
    std::cerr << "mixtrain: error: " << first_line(e.what_without_backtrace()) << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "mixtrain: error: " << first_line(e.what()) << std::endl;
  }
  return kExitError;
}
