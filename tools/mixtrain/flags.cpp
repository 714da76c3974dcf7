#include "flags.h"

#include <mixtrain/amp/mixed_precision.h>
#include <mixtrain/models.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace mixtrain_cli {

namespace {
std::string format_number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
} // namespace

void add_train_flags(CLI::App& cmd, TrainArgs& a, bool for_doctor) {
  mixtrain::RunConfig& r = a.run;
  auto& scaler = r.precision_options.scaler();
  auto& master = r.precision_options.master();
  cmd.add_option("--data", r.data,
                 "Fashion-MNIST's directory (four idx .gz files), or a .pt file written by Python's torch.save with "
                 "'x' (a tensor or a list of tensors), 'y' and optionally 'valid_x', 'valid_y'; for the transformer a "
                 "text file or directory (default: Fashion-MNIST in " + std::string(mixtrain::data::kFashionMnistDir) +
                     ", the transformer's corpus in " + mixtrain::data::kFortunesDir + ")");
  cmd.add_option("--model", r.model,
                 "Model: a TorchScript file (torch.jit.script(model).save(PATH)), or built-in cnn (2 conv+BN "
                 "layers), mlp (784-256-10), resnet (residual CNN with BatchNorm), transformer (character-level "
                 "decoder-only language model)")
      ->capture_default_str();
  cmd.add_option("--loss", r.loss, "Loss: cross_entropy (classes; also [N, T, C] sequences), mse, bce_with_logits")
      ->capture_default_str();
  cmd.add_option("--epochs", r.epochs, "Epochs to train (>= 1)")->capture_default_str();
  cmd.add_option_function<std::string>(
         "--lr",
         [&r](const std::string& v) {
           try {
             r.lr = mixtrain::Lrs::parse(v);
           } catch (const c10::Error& e) {
             // In the CLI's words: "invalid --lr -1: must be > 0", "invalid --lr x (takes ...)".
             const std::string m = e.msg();
             const size_t takes = m.find(" (takes");
             const std::string why = m.rfind("Invalid lr: ", 0) == 0 ? ": must be > 0"
                                     : takes != std::string::npos  ? m.substr(takes)
                                                                   : ": " + m;
             throw CLI::ValidationError("invalid --lr " + v + why);
           }
         },
         for_doctor ? "Peak learning rate of the one-cycle schedule (> 0)"
                    : "Peak learning rate of the one-cycle schedule (> 0); with --split-at one per parameter group "
                      "(1e-4,1e-3) or fastai's slice: LO:HI spreads them geometrically, :HI gives HI/10 to all but "
                      "the last group")
      ->default_str(r.lr.str());
  cmd.add_option("--bs", r.bs, "Batch size (>= 1)")->capture_default_str();
  cmd.add_option_function<int64_t>(
         "--seed",
         [&r](int64_t v) {
           if (v < 0) throw CLI::ValidationError("--seed", "invalid --seed " + std::to_string(v) + ": must be >= 0");
           r.seed = static_cast<uint64_t>(v);
         },
         "Seed for weights and data order (0 to 2^63-1); same seed + threads = same result")
      ->default_str(std::to_string(r.seed));
  cmd.add_option("--limit", r.limit, "Train on the first N training images only (>= 1; default: all 60000)");
  cmd.add_option("--threads", r.threads, "Intra-op threads (>= 1; default 0 = all cores, OpenBLAS pinned to 1 thread)")
      ->capture_default_str();
  cmd.add_option("--out", a.out,
                 for_doctor ? "Directory for diagnosis.json, loss.svg and scale.svg (default: runs/doctor-<timestamp>)"
                            : "Run directory for metrics.csv, steps.csv, summary.json (default: runs/<timestamp>)");
  std::string precision_help = "Training precision: fp32, fp16 (autocast + dynamic loss scaling; emulated on CPU), "
                               "bf16 (autocast, no scaler), bf16-master / fp16-master (model stored in bf16/fp16, "
                               "fp32 master weights, norm layers fp32)";
  if (for_doctor) precision_help = "The precision compared with fp32: fp16 (default) or bf16";
  cmd.add_option_function<std::string>(
         "--precision",
         [&r](const std::string& v) {
           try {
             r.precision = mixtrain::parse_precision(v);
           } catch (const c10::Error& e) {
             throw CLI::ValidationError("--precision", e.msg());
           }
         },
         precision_help)
      ->default_str(mixtrain::precision_name(r.precision));
  cmd.add_option_function<double>("--init-scale", [&scaler](double v) { scaler.init_scale(v); },
                                  "fp16: initial loss scale (default 65536)");
  cmd.add_option_function<double>("--growth-factor", [&scaler](double v) { scaler.growth_factor(v); },
                                  "fp16: scale multiplier after growth-interval clean steps (default 2)");
  cmd.add_option_function<double>("--backoff-factor", [&scaler](double v) { scaler.backoff_factor(v); },
                                  "fp16: scale multiplier on overflow (default 0.5)");
  cmd.add_option_function<int64_t>("--growth-interval", [&scaler](int64_t v) { scaler.growth_interval(v); },
                                   "fp16: clean steps before the scale grows (default 2000)");
  cmd.add_flag_function("--no-emulation", [&r](int64_t) { r.precision_options.allow_fp16_emulation(false); },
                        "fp16 on CPU: fail instead of emulating fp16 numerics (emulation checks fp16 safety; no speed-up)");
  cmd.add_option("--clip", r.clip, "Clip the global gradient norm to X (after unscaling; default: off)");
  cmd.add_option("--accum", r.accum, "Accumulate gradients over N batches per optimizer step (default 1)")
      ->capture_default_str();
  cmd.add_flag("--wd-bn-bias", r.wd_bn_bias,
               "Apply weight decay to norm layers' parameters and biases too (fastai's wd_bn_bias; default: not)");
  if (for_doctor) return;
  cmd.add_option_function<double>("--loss-scale", [&master](double v) { master.loss_scale(v).dynamic(false); },
                                  "fp16-master/bf16-master: a static loss scale X (default: dynamic from 65536)");
  cmd.add_option_function<int64_t>("--max-noskip", [&master](int64_t v) { master.max_noskip(v); },
                                   "fp16-master/bf16-master: clean steps before the scale doubles (default 1000)");
  cmd.add_option_function<double>("--max-scale", [&master](double v) { master.max_scale(v); },
                                  "fp16-master/bf16-master: the scale never grows past X (default 16777216)");
  cmd.add_flag_function("--flat-master", [&master](int64_t) { master.flat_master(true); },
                        "fp16-master/bf16-master: one contiguous fp32 master buffer per param group");
  cmd.add_option("--split-at", r.split_at,
                 "Parameter groups: a new group starts at each named layer (comma-separated parameter-name "
                 "prefixes in model order, e.g. head or 4,8); each group gets its own --lr");
  cmd.add_option("--freeze-to", r.freeze_to,
                 "Train only parameter groups N and after (with --split-at; norm layers still train, as fastai)")
      ->capture_default_str();
  cmd.add_flag("--save-best", r.save_best,
               "Keep the model of the best epoch (by --monitor) and end the run with it (OUT/model.pt is the best)");
  cmd.add_option("--early-stop", r.early_stop,
                 "Stop once PATIENCE epochs in a row brought no improvement in --monitor (fastai's EarlyStopping)");
  cmd.add_option("--monitor", r.monitor,
                 "What --save-best and --early-stop follow: valid_loss, train_loss, or a metric (accuracy, perplexity)")
      ->capture_default_str();
  cmd.add_option("--save-every", r.save_every,
                 "Save a checkpoint every N epochs and after the last (default 0: only on Ctrl-C)");
  cmd.add_option("--keep", r.keep, "Keep only the newest K checkpoints (default 0: all)");
  cmd.add_option("--resume", a.resume,
                 "Continue the run in OUT_DIR from its latest checkpoint, with the run's own flags (OUT_DIR/args.json)");
  cmd.add_flag("--force", a.force, "Start a new run in an --out directory that already holds checkpoints");
  cmd.add_option("--max-bad-steps", r.max_bad_steps,
                 "With loss scaling (fp16, *-master): stop after more than N consecutive NaN/inf losses "
                 "(fp32/bf16 stop at the first)")
      ->capture_default_str();
  cmd.add_option("--comm-dtype", r.comm_dtype,
                 "Data parallel (under mixtrain launch / torchrun): dtype gradients travel in, fp32 or fp16 (half the traffic)")
      ->capture_default_str();
  cmd.add_option("--timeout", a.timeout,
                 "Data parallel: seconds to wait for the other ranks, at the rendezvous and in every collective")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // Testing aids (mixtrain/testing.h), hidden from --help.
  cmd.add_option("--interrupt-at-step", a.interrupt_at_step)->group("");
  cmd.add_option("--abort-at-step", a.abort_at_step)->group("");
  cmd.add_option("--inject-overflow-at-step", a.inject_overflow_at_step)->group("");
}

void validate(const TrainArgs& a, bool check_device) {
  const mixtrain::RunConfig& r = a.run;
  auto at_least = [](const char* flag, int64_t v, int64_t lo) {
    if (v < lo) throw UsageError(std::string("invalid ") + flag + " " + std::to_string(v) + ": must be >= " + std::to_string(lo));
  };
  if (r.split_at.empty() && r.freeze_to != 0)
    throw UsageError("--freeze-to " + std::to_string(r.freeze_to) + " needs parameter groups: name where they start "
                     "with --split-at");
  at_least("--bs", r.bs, 1);
  at_least("--epochs", r.epochs, 1);
  if (r.limit == 0 || r.limit < -1) throw UsageError("invalid --limit " + std::to_string(r.limit) + ": must be >= 1");
  at_least("--threads", r.threads, 0);
  if (!is_builtin_model(r.model) && !fs::is_regular_file(r.model))
    throw UsageError("unknown --model '" + r.model + "': not a built-in model (cnn, mlp, resnet, transformer) " +
                     (fs::exists(r.model) ? "and not a file" : "and no such file"));
  if (r.loss != "cross_entropy" && r.loss != "mse" && r.loss != "bce_with_logits")
    throw UsageError("unknown --loss '" + r.loss + "' (choices: cross_entropy, mse, bce_with_logits)");
  if (r.clip < 0 || !std::isfinite(r.clip)) throw UsageError("invalid --clip " + format_number(r.clip) + ": must be > 0");
  at_least("--accum", r.accum, 1);
  at_least("--save-every", r.save_every, 0);
  at_least("--keep", r.keep, 0);
  at_least("--max-bad-steps", r.max_bad_steps, 0);
  if (r.early_stop < -1) throw UsageError("invalid --early-stop " + std::to_string(r.early_stop) + ": must be >= 0");
  if (r.comm_dtype != "fp32" && r.comm_dtype != "fp16")
    throw UsageError("invalid --comm-dtype '" + r.comm_dtype + "' (choices: fp32, fp16)");
  // The library's own option checks (c10::Error, reported as one line by main()).
  mixtrain::validate_precision(r.precision, r.precision_options, torch::kCPU);
  // The CLI trains on CPU: fp16 there is emulated, or an error with --no-emulation.
  if (check_device && (r.precision == mixtrain::Precision::kFp16 || r.precision == mixtrain::Precision::kBf16))
    mixtrain::amp::check_precision_supported(r.precision == mixtrain::Precision::kFp16 ? torch::kHalf : torch::kBFloat16,
                                             torch::kCPU, r.precision_options.allow_fp16_emulation());
  if (!r.data.empty() && !fs::exists(r.data)) throw UsageError("--data " + r.data + " not found");
}

bool is_builtin_model(const std::string& name) {
  const auto names = mixtrain::models::builtin_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string in_flag_terms(std::string m) {
  static const std::vector<std::pair<std::regex, std::string>> kTerms = {
      {std::regex(R"(\bprecision (fp16-master|bf16-master|fp16|bf16)\b)"), "--precision $1"},
      {std::regex(R"(\buse (bf16-master)\b)"), "use --precision $1"},
      {std::regex(R"(GradScalerOptions\(\)\.init_scale\(([^)]*)\))"), "--init-scale $1"},
      {std::regex(R"(callbacks::GradientClip\(([^)]*)\))"), "--clip $1"},
      {std::regex(R"(to_half\(MasterWeightsOptions\(\)\.dtype\(kBFloat16\)\))"), "--precision bf16-master"},
      {std::regex(R"(to_fp16\(\))"), "--precision fp16"},
      {std::regex(R"(to_bf16\(\))"), "--precision bf16"},
      {std::regex(R"(allow_fp16_emulation true)"), "drop --no-emulation"},
      {std::regex(R"(allow_fp16_emulation false)"), "--no-emulation"},
  };
  for (const auto& [pattern, flag] : kTerms) m = std::regex_replace(m, pattern, flag);
  return m;
}

std::vector<std::string> ignored_flag_warnings(const CLI::App& cmd, const mixtrain::RunConfig& r, int cores) {
  using mixtrain::Precision;
  std::vector<std::string> out;
  auto given = [&cmd](const char* flag) {  // doctor lacks the train-only flags
    const CLI::Option* opt = cmd.get_option_no_throw(flag);
    return opt != nullptr && opt->count() > 0;
  };
  const bool scaler = r.precision == Precision::kFp16;
  const bool master = r.precision == Precision::kFp16Master || r.precision == Precision::kBf16Master;
  for (const char* flag : {"--init-scale", "--growth-factor", "--backoff-factor", "--growth-interval"})
    if (given(flag) && !scaler)
      out.push_back(std::string(flag) + " does nothing with --precision " + mixtrain::precision_name(r.precision) +
                    " (it sets fp16's GradScaler)");
  for (const char* flag : {"--loss-scale", "--max-noskip", "--max-scale", "--flat-master"})
    if (given(flag) && !master)
      out.push_back(std::string(flag) + " does nothing with --precision " + mixtrain::precision_name(r.precision) +
                    " (it sets fp16-master/bf16-master)");
  if (given("--no-emulation") && r.precision != Precision::kFp16)
    out.push_back("--no-emulation does nothing with --precision " + mixtrain::precision_name(r.precision));
  if (cores > 0 && r.threads > cores)
    out.push_back("--threads " + std::to_string(r.threads) + " is more than this machine's " + std::to_string(cores) +
                  " cores: threads will oversubscribe them");
  return out;
}

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

std::string default_run_dir(const std::string& prefix) {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&t));
  return "runs/" + prefix + buf + "-" + std::to_string(::getpid());
}

} // namespace mixtrain_cli
