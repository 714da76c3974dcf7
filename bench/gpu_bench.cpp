// Throughput and peak memory of fp32 / fp16 / bf16 training with mixtrain's Learner,
// for the GPU check (scripts/gpu-check.sh) on three models:
//   cnn          the Fashion-MNIST CNN (1x28x28)
//   resnet       a ResNet-style CNN on 3x128x128
//   transformer  the built-in GPT-style transformer (models::TransformerLM) at d 1024, 6 layers, context 1024
// It runs on CPU as well (--device cpu), with --tiny sizes, so that its argument
// handling and JSON are tested in CI. One JSON object per line on stdout, or to --json.
//
//   gpu_bench [--device cuda|cpu] [--models cnn,resnet,transformer] [--precisions fp32,tf32,fp16,bf16]
//             [--steps N] [--warmup N] [--tiny] [--json PATH]
//   gpu_bench --emulation-compare [--device cuda|cpu] [--models ...] [--steps N] [--init-scale X] [--json PATH]
//             the same seeded fp16 run (same weights, batches, lr) on --device with real fp16
//             autocast, and on CPU with mixtrain's fp16 emulation; one JSON line per model with
//             both per-step loss sequences, their differences and the skipped steps of each.
//   gpu_bench --doctor-compare [--device cuda|cpu] [--json PATH]
//             the held-in doctor cases (tests/compare_test.cpp's: healthy, an overflowing layer,
//             a loss scale of 2^-20, a loss weighted 1e8) judged by diagnose::compare on --device
//             and on the CPU (emulated fp16); one JSON line per case with both verdicts.
#include <mixtrain/mixtrain.h>

#include <ATen/record_function.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#ifdef MIXTRAIN_BENCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

namespace nn = torch::nn;
using mixtrain::Learner;

namespace {

struct BenchArgs {
  std::string device = "cuda";
  std::vector<std::string> models{"cnn", "resnet", "transformer"};
  std::vector<std::string> precisions{"fp32", "tf32", "fp16", "bf16"};
  int64_t steps = 30, warmup = 5;
  bool tiny = false;
  std::string json;
  bool emulation_compare = false;
  bool doctor_compare = false;
  double init_scale = 65536.0;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

/// Parses argv; throws std::invalid_argument with a one-line message.
BenchArgs parse(int argc, char** argv) {
  BenchArgs a;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto positive = [](const std::string& flag, const std::string& v) {
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (*end != '\0' || n < 1) throw std::invalid_argument("invalid " + flag + " '" + v + "' (must be >= 1)");
    return static_cast<int64_t>(n);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--device") a.device = value(i);
    else if (f == "--models") a.models = split_list(value(i));
    else if (f == "--precisions") a.precisions = split_list(value(i));
    else if (f == "--steps") a.steps = positive(f, value(i));
    else if (f == "--warmup") a.warmup = positive(f, value(i));
    else if (f == "--tiny") a.tiny = true;
    else if (f == "--json") a.json = value(i);
    else if (f == "--emulation-compare") a.emulation_compare = true;
    else if (f == "--doctor-compare") a.doctor_compare = true;
    else if (f == "--init-scale") a.init_scale = std::stod(value(i));
    else throw std::invalid_argument("unknown flag '" + f + "'");
  }
  if (a.device != "cuda" && a.device != "cpu") throw std::invalid_argument("invalid --device '" + a.device + "' (cuda or cpu)");
  for (const auto& m : a.models)
    if (m != "cnn" && m != "resnet" && m != "transformer")
      throw std::invalid_argument("unknown model '" + m + "' (cnn, resnet, transformer)");
  for (const auto& p : a.precisions)
    if (p != "fp32" && p != "tf32" && p != "fp16" && p != "bf16")
      throw std::invalid_argument("unknown precision '" + p + "' (fp32, tf32, fp16, bf16)");
  if (a.models.empty() || a.precisions.empty()) throw std::invalid_argument("--models and --precisions must not be empty");
  return a;
}

// ---- Models (bench/gpu_python_bench.py builds the same ones in PyTorch) ----

struct ResBlockImpl : nn::Module {
  ResBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))),
        shortcut(register_module("shortcut", nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)))) {}
  torch::Tensor forward(torch::Tensor x) {
    return torch::relu(bn2(conv2(torch::relu(bn1(conv1(x))))) + shortcut(x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Conv2d shortcut;
};
TORCH_MODULE(ResBlock);

/// stem 3->32 (stride 2), blocks 32->64->128->256 (stride 2 each), pool, linear -> 10.
nn::Sequential resnet(int64_t width) {
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, width, 3).stride(2).padding(1).bias(false)),
                        nn::BatchNorm2d(width), nn::ReLU(), ResBlock(width, 2 * width, 2),
                        ResBlock(2 * width, 4 * width, 2), ResBlock(4 * width, 8 * width, 2),
                        nn::AdaptiveAvgPool2d(1), nn::Flatten(), nn::Linear(8 * width, 10));
}

/// The built-in transformer (mixtrain::models::TransformerLM: GPT-style, pre-norm,
/// causal attention through torch 2.x's fused scaled_dot_product_attention) at `vocab`,
/// `d`, `layers`, `heads` and context `seq`.
mixtrain::models::TransformerLM transformer(int64_t vocab, int64_t d, int64_t layers, int64_t heads, int64_t seq) {
  return mixtrain::models::TransformerLM(
      mixtrain::models::TransformerOptions().vocab(vocab).d_model(d).layers(layers).heads(heads).context(seq));
}

struct Workload {
  mixtrain::Model model;
  torch::Tensor x, y;  // one batch, repeated
  mixtrain::LossFn loss;
  int64_t batch;
};

Workload make_workload(const std::string& name, bool tiny, const torch::Device& device) {
  auto ce = mixtrain::cross_entropy();
  if (name == "cnn") {
    const int64_t b = tiny ? 8 : 256;
    return {mixtrain::models::simple_cnn(), torch::randn({b, 1, 28, 28}), torch::randint(10, {b}), ce, b};
  }
  if (name == "resnet") {
    const int64_t b = tiny ? 4 : 256, side = tiny ? 32 : 128;
    return {resnet(tiny ? 8 : 32), torch::randn({b, 3, side, side}), torch::randint(10, {b}), ce, b};
  }
  const int64_t vocab = tiny ? 128 : 8192, d = tiny ? 32 : 1024, layers = tiny ? 2 : 6, seq = tiny ? 16 : 1024;
  const int64_t b = tiny ? 2 : 8;
  auto lm = transformer(vocab, d, layers, tiny ? 4 : 16, seq);
  torch::Tensor tokens = torch::randint(vocab, {b, seq + 1});
  mixtrain::LossFn lm_loss = [vocab](const torch::Tensor& logits, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), target.reshape({-1}));
  };
  return {lm, tokens.slice(1, 0, seq), tokens.slice(1, 1, seq + 1), lm_loss, b};
}

/// Counts host reads of device values (aten::_local_scalar_dense: item(), and
/// what prints or compares a tensor's value) while enabled.
std::atomic<int64_t> g_scalar_reads{0};
std::atomic<bool> g_count_reads{false};

void install_read_counter() {
  at::addGlobalCallback(at::RecordFunctionCallback(
                            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                              if (g_count_reads.load() && std::string(fn.name()) == "aten::_local_scalar_dense")
                                ++g_scalar_reads;
                              return nullptr;
                            })
                            .needsInputs(false));
}

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

nlohmann::json run_one(const BenchArgs& a, const std::string& model_name, const std::string& precision) {
  const torch::Device device(a.device == "cuda" ? torch::kCUDA : torch::kCPU);
  torch::manual_seed(0);
  Workload w = make_workload(model_name, a.tiny, device);
  // The data: the same batch `steps` times, already on the device (no input pipeline is measured).
  auto repeat = [&](const torch::Tensor& t, int64_t n) {
    std::vector<int64_t> reps(t.dim(), 1);
    reps[0] = n;
    return t.repeat(reps).to(device);
  };
  const mixtrain::data::Dataset valid{w.x.slice(0, 0, 1).to(device), w.y.slice(0, 0, 1).to(device)};
  auto loaders = [&](int64_t n) {
    mixtrain::data::Dataset train{repeat(w.x, n), repeat(w.y, n)};
    return mixtrain::data::DataLoaders(
        mixtrain::data::DataLoader(train, mixtrain::data::DataLoaderOptions().batch_size(w.batch)),
        mixtrain::data::DataLoader(valid, mixtrain::data::DataLoaderOptions().batch_size(1)));
  };
  w.model.module().to(device);
  Learner learn(w.model, loaders(a.warmup), w.loss, mixtrain::LearnerOptions().progress(false).device(device));
  if (precision == "fp16") learn.to_fp16();
  if (precision == "bf16") learn.to_bf16();
  // tf32: fp32 storage, TensorFloat-32 matmuls and convolutions (the GPU baseline the goals use).
  at::globalContext().setAllowTF32CuBLAS(precision == "tf32");
  at::globalContext().setAllowTF32CuDNN(precision == "tf32");

  nlohmann::json r{{"model", model_name}, {"precision", precision}, {"device", a.device}, {"batch", w.batch},
                   {"steps", a.steps}, {"tiny", a.tiny}};
  learn.fit(1, 1e-4);  // warm-up: allocator, cuDNN autotuning, lazy initialization
  learn.dls() = loaders(a.steps);
#ifdef MIXTRAIN_BENCH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
#endif
  sync(device);
  g_scalar_reads = 0;
  g_count_reads = true;
  const auto start = std::chrono::steady_clock::now();
  learn.fit(1, 1e-4);
  sync(device);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  g_count_reads = false;
  r["seconds"] = seconds;
  r["step_ms"] = 1000 * seconds / a.steps;
  r["steps_per_second"] = a.steps / seconds;
  r["samples_per_second"] = a.steps * w.batch / seconds;
  // Includes the one validation batch per fit and its reads.
  r["host_scalar_reads_per_step"] = static_cast<double>(g_scalar_reads.load()) / a.steps;
  r["final_loss"] = learn.recorder().steps().back().loss;
  r["skipped_steps"] = learn.recorder().skipped_steps();
  r["peak_memory_bytes"] = nullptr;
#ifdef MIXTRAIN_BENCH_CUDA
  // The timed steps' peak, read before the count below runs a step of its own.
  const int64_t peak_bytes =
      device.is_cuda()
          ? c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index()).allocated_bytes[0].peak
          : 0;
#endif
  // The ops one more step dispatches (each a kernel launch or more on a GPU; Python's twin
  // counts its own the same way), after the timing: counting observes every op.
  r["ops_per_step"] = mixtrain::diagnose::count_step_ops(learn, 0).ops;
#ifdef MIXTRAIN_BENCH_CUDA
  if (device.is_cuda()) {
    r["peak_memory_bytes"] = peak_bytes;  // allocated_bytes[0]: all pools together
    // The loader holds every timed step's batch on the device (`steps` copies of one batch),
    // while Python's loop holds one: 1.5 GB of the ResNet-style net's 2.03 GB peak on the
    // H200 was its data. Beyond the data: the peak as Python's loop would have it.
    const int64_t batch_bytes = static_cast<int64_t>(w.x.nbytes() + w.y.nbytes());
    r["data_bytes"] = batch_bytes * a.steps;
    r["peak_memory_beyond_data_bytes"] = peak_bytes - batch_bytes * (a.steps - 1);
  }
#endif
  return r;
}

/// Small sizes of the three models, so that the CPU side of the comparison runs 50
/// emulated steps in seconds.
Workload make_compare_workload(const std::string& name) {
  auto ce = mixtrain::cross_entropy();
  if (name == "cnn") return {mixtrain::models::simple_cnn(), torch::randn({64, 1, 28, 28}), torch::randint(10, {64}), ce, 64};
  if (name == "resnet") return {resnet(8), torch::randn({16, 3, 32, 32}), torch::randint(10, {16}), ce, 16};
  // The built-in transformer workload itself (mixtrain train --model transformer).
  const int64_t vocab = 256, d = 128, seq = 64, b = 8;
  auto lm = transformer(vocab, d, 2, 4, seq);
  torch::Tensor tokens = torch::randint(vocab, {b, seq + 1});
  mixtrain::LossFn lm_loss = [vocab](const torch::Tensor& logits, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), target.reshape({-1}));
  };
  return {lm, tokens.slice(1, 0, seq), tokens.slice(1, 1, seq + 1), lm_loss, b};
}

/// One fp16 run of `steps` steps (fresh batches, drawn from a seeded generator on the
/// CPU) on `device`: per-step losses and skips. Same seed, same weights, same data.
std::pair<std::vector<double>, std::vector<bool>> fp16_run(const std::string& model_name, const torch::Device& device,
                                                           int64_t steps, double init_scale) {
  torch::manual_seed(1234);
  Workload w = make_compare_workload(model_name);
  std::vector<torch::Tensor> xs, ys;
  auto gen = at::detail::createCPUGenerator(99);
  for (int64_t s = 0; s < steps; ++s) {
    // A new batch each step, of the workload's shapes and value ranges.
    xs.push_back(w.x.is_floating_point() ? torch::randn(w.x.sizes(), gen)
                                         : torch::randint(w.x.max().item<int64_t>() + 1, w.x.sizes(), gen));
    ys.push_back(torch::randint(w.y.max().item<int64_t>() + 1, w.y.sizes(), gen));
  }
  mixtrain::data::Dataset train{torch::cat(xs).to(device), torch::cat(ys).to(device)};
  mixtrain::data::Dataset valid{w.x.slice(0, 0, 1).to(device), w.y.slice(0, 0, 1).to(device)};
  mixtrain::data::DataLoaders dls(
      mixtrain::data::DataLoader(train, mixtrain::data::DataLoaderOptions().batch_size(w.batch)),
      mixtrain::data::DataLoader(valid, mixtrain::data::DataLoaderOptions().batch_size(1)));
  w.model.module().to(device);
  Learner learn(w.model, dls, w.loss, mixtrain::LearnerOptions().progress(false).device(device));
  learn.to_fp16(mixtrain::amp::GradScalerOptions().init_scale(init_scale).growth_interval(10));
  learn.fit(1, 1e-3);
  std::vector<double> losses;
  std::vector<bool> skipped;
  for (const auto& row : learn.recorder().steps()) {
    losses.push_back(row.loss);
    skipped.push_back(row.skipped);
  }
  return {losses, skipped};
}

nlohmann::json compare_emulation(const BenchArgs& a, const std::string& model_name) {
  const torch::Device device(a.device == "cuda" ? torch::kCUDA : torch::kCPU);
  const auto real = fp16_run(model_name, device, a.steps, a.init_scale);
  const auto emulated = fp16_run(model_name, torch::Device(torch::kCPU), a.steps, a.init_scale);
  std::vector<double> diff;
  std::vector<int64_t> skipped_real, skipped_emulated;
  double max_diff = 0;
  for (size_t i = 0; i < real.first.size() && i < emulated.first.size(); ++i) {
    diff.push_back(std::abs(real.first[i] - emulated.first[i]));
    if (std::isfinite(diff.back())) max_diff = std::max(max_diff, diff.back());
  }
  for (size_t i = 0; i < real.second.size(); ++i)
    if (real.second[i]) skipped_real.push_back(static_cast<int64_t>(i));
  for (size_t i = 0; i < emulated.second.size(); ++i)
    if (emulated.second[i]) skipped_emulated.push_back(static_cast<int64_t>(i));
  const double first_rel = diff.empty() ? NAN : diff[0] / std::max(1e-12, std::abs(real.first[0]));
  return {{"model", model_name}, {"device", a.device}, {"steps", a.steps}, {"init_scale", a.init_scale},
          {"loss_real", real.first}, {"loss_emulated", emulated.first}, {"abs_diff", diff},
          {"max_abs_diff", max_diff}, {"first_step_rel_diff", first_rel},
          // fp16 has a 2^-11 relative unit roundoff; the first step's loss agrees "to fp16 precision"
          // when within a few of them.
          {"first_step_within_fp16", first_rel <= 4 * std::ldexp(1.0, -11)},
          {"skipped_real", skipped_real}, {"skipped_emulated", skipped_emulated},
          {"same_skips", skipped_real == skipped_emulated}};
}

/// tests/compare_test.cpp's classifier: stem -> fc1 -> fc2 -> head.
struct DoctorNetImpl : nn::Module {
  DoctorNetImpl()
      : stem(register_module("stem", nn::Linear(4, 16))), fc1(register_module("fc1", nn::Linear(16, 16))),
        fc2(register_module("fc2", nn::Linear(16, 16))), head(register_module("head", nn::Linear(16, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return head(torch::relu(fc2(torch::relu(fc1(torch::relu(stem(x))))))); }
  nn::Linear stem, fc1, fc2, head;
};
TORCH_MODULE(DoctorNet);

/// Three well-separated Gaussian blobs in 4-d, seeded: tests/test_util.h's blobs().
mixtrain::data::Dataset doctor_blobs(int64_t n, uint64_t seed) {
  torch::Tensor centers = torch::randn({3, 4}, at::detail::createCPUGenerator(0)) * 3;
  auto gen = at::detail::createCPUGenerator(seed);
  torch::Tensor y = torch::randint(3, {n}, gen, torch::kLong);
  return {centers.index_select(0, y) + torch::randn({n, 4}, gen) * 0.5, y};
}

std::string doctor_verdict(const std::string& name, const torch::Device& device) {
  const bool overflow = name == "forward_overflow", heavy_loss = name == "gradient_overflow";
  auto factory = [=] {
    DoctorNet net;
    if (overflow) {
      torch::NoGradGuard g;
      net->fc1->weight.mul_(1e5);
      net->fc2->weight.div_(1e5);
    }
    net->to(device);
    mixtrain::data::Dataset train = doctor_blobs(256, 1), valid = doctor_blobs(128, 2);
    train = {train.x.to(device), train.y.to(device)};
    valid = {valid.x.to(device), valid.y.to(device)};
    mixtrain::LossFn loss = mixtrain::cross_entropy();
    if (heavy_loss)
      loss = [](const torch::Tensor& p, const torch::Tensor& y) { return torch::nn::functional::cross_entropy(p, y) * 1e8; };
    return std::make_unique<Learner>(mixtrain::Model(net), mixtrain::data::DataLoaders::from_split({train, valid}, 16, 7),
                                     loss, mixtrain::LearnerOptions().progress(false).device(device));
  };
  auto options = mixtrain::diagnose::CompareOptions().epochs(overflow ? 1 : 2).lr(1e-2);
  if (name == "underflow") options.precision_options().scaler().init_scale(std::ldexp(1.0, -20));
  torch::manual_seed(0);
  return mixtrain::diagnose::to_string(mixtrain::diagnose::compare(factory, options).verdict);
}

} // namespace

int main(int argc, char** argv) {
  BenchArgs a;
  try {
    a = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "gpu_bench: error: " << e.what() << std::endl;
    return 2;
  }
  if (a.device == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "gpu_bench: error: --device cuda, but this libtorch has no CUDA or no GPU is visible" << std::endl;
    return 2;
  }
  install_read_counter();
  std::ofstream file;
  if (!a.json.empty()) {
    file.open(a.json);
    if (!file) {
      std::cerr << "gpu_bench: error: cannot write " << a.json << std::endl;
      return 2;
    }
  }
  std::ostream& out = a.json.empty() ? std::cout : file;
  int failures = 0;
  if (a.doctor_compare) {
    const torch::Device device(a.device == "cuda" ? torch::kCUDA : torch::kCPU);
    for (const char* name : {"healthy", "forward_overflow", "underflow", "gradient_overflow"}) {
      nlohmann::json r{{"case", name}};
      try {
        r["device_verdict"] = doctor_verdict(name, device);
        r["cpu_emulated_verdict"] = doctor_verdict(name, torch::Device(torch::kCPU));
        r["same"] = r["device_verdict"] == r["cpu_emulated_verdict"];
      } catch (const std::exception& e) {
        const std::string msg = e.what();
        r["error"] = msg.substr(0, msg.find('\n'));
        ++failures;
      }
      out << r.dump() << std::endl;
      std::cerr << "gpu_bench: doctor " << r.dump() << std::endl;
    }
    return failures ? 1 : 0;
  }
  if (a.emulation_compare) {
    for (const auto& m : a.models) {
      nlohmann::json r;
      try {
        r = compare_emulation(a, m);
      } catch (const std::exception& e) {
        const std::string msg = e.what();
        r = {{"model", m}, {"error", msg.substr(0, msg.find('\n'))}};
        ++failures;
      }
      out << r.dump() << std::endl;
      std::cerr << "gpu_bench: emulation " << m << ": "
                << (r.contains("error") ? "error: " + r["error"].get<std::string>()
                                        : "first-step rel diff " + std::to_string(r["first_step_rel_diff"].get<double>()) +
                                              ", max abs diff " + std::to_string(r["max_abs_diff"].get<double>()) +
                                              ", same skips " + (r["same_skips"].get<bool>() ? "yes" : "no"))
                << std::endl;
    }
    return failures ? 1 : 0;
  }
  for (const auto& m : a.models)
    for (const auto& p : a.precisions) {
      nlohmann::json r;
      try {
        r = run_one(a, m, p);
      } catch (const std::exception& e) {
        const std::string msg = e.what();
        r = {{"model", m}, {"precision", p}, {"device", a.device}, {"error", msg.substr(0, msg.find('\n'))}};
        ++failures;
      }
      out << r.dump() << std::endl;
      std::cerr << "gpu_bench: " << m << " " << p << ": "
                << (r.contains("error") ? "error: " + r["error"].get<std::string>()
                                        : std::to_string(r["samples_per_second"].get<double>()) + " samples/s")
                << std::endl;
    }
  return failures ? 1 : 0;
}
