// The trained model as a file: TorchScript for scripted models, an archive for built-ins.
#include "mixtrain/run/model_file.h"

#include "util/bounded_archive.h"
#include "util/first_line.h"
#include "util/read_file.h"
#include "mixtrain/util/atomic_file.h"
#include "mixtrain/run/model_registry.h"
#include "mixtrain/models/scripted_model.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>
#include <optional>
#include <sstream>

namespace mixtrain {

namespace {
/// The archive key that names the built-in model.
constexpr const char* kBuiltinKey = "mixtrain.builtin_model";
} // namespace

void save_model(const Model& model, const std::string& path, const std::string& builtin_name) {
  if (is_scripted(model)) {
    save_scripted_model(model, path);
    return;
  }
  TORCH_CHECK(!builtin_name.empty(), "save_model: a native model needs its built-in name (",
              "use torch::save for a model of your own)");
  // On the CPU, floating point as fp32 whatever precision trained it.
  const auto stored = [](const torch::Tensor& t) {
    return t.detach().to(torch::kCPU).to(t.is_floating_point() ? torch::kFloat : t.scalar_type());
  };
  torch::serialize::OutputArchive archive;
  archive.write(kBuiltinKey, c10::IValue(builtin_name));
  for (const auto& p : model.module().named_parameters()) archive.write(p.key(), stored(p.value()));
  for (const auto& b : model.module().named_buffers()) archive.write(b.key(), stored(b.value()), /*is_buffer=*/true);
  write_file_atomically(path, [&](std::ostream& out) { archive.save_to(out); });
}

Model load_model(const std::string& path, const std::string& output) {
  std::error_code ec;
  TORCH_CHECK(std::filesystem::is_regular_file(path, ec), "Model file not found: ", path);
  // Unpickled as checkpoints and TorchScript files are (ARCHITECTURE.md): its pickles walked
  // first, its records read through a bounded reader, and every tensor checked against the
  // record that holds it, since libtorch sizes a storage by what the pickle claims.
  const std::string bytes = detail::read_whole_file(path, "model ");
  torch::serialize::InputArchive archive;
  c10::IValue name;
  bool builtin = false;
  std::optional<detail::BoundedReader> reader;
  if (detail::first_compressed_storage_record(bytes.data(), bytes.size()).empty()) {
    try {
      reader.emplace(bytes.data(), bytes.size());
      detail::load_archive_bounded(*reader, bytes.data(), bytes.size(), archive, "model");
      builtin = archive.try_read(kBuiltinKey, name) && name.isString();
    } catch (const c10::Error&) {
      builtin = false;  // not an archive of ours: maybe TorchScript, load_scripted_model says
    }
  }
  if (builtin) detail::check_archive_tensors(archive, *reader, "Model file " + path);
  Model model;
  if (builtin) {
    model = run::build_builtin_model(name.toStringRef());
    torch::NoGradGuard no_grad;
    for (auto& p : model.module().named_parameters()) {
      torch::Tensor saved;
      TORCH_CHECK(archive.try_read(p.key(), saved), path, " has no '", p.key(), "' for the built-in ",
                  name.toStringRef());
      TORCH_CHECK(saved.sizes() == p.value().sizes(), path, ": '", p.key(), "' is ", saved.sizes(), ", the ",
                  name.toStringRef(), " needs ", p.value().sizes());
      p.value().copy_(saved);
    }
    for (auto& b : model.module().named_buffers()) {
      torch::Tensor saved;
      TORCH_CHECK(archive.try_read(b.key(), saved, /*is_buffer=*/true), path, " has no buffer '", b.key(), "'");
      b.value().copy_(saved);
    }
  } else {
    model = load_scripted_model(path, output);
  }
  model.module().eval();
  return model;
}

torch::Tensor predict(const Model& model, const ModelInputs& inputs, int64_t batch_size) {
  TORCH_CHECK(!inputs.empty() && inputs[0].defined() && inputs[0].dim() > 0, "predict needs at least one input tensor");
  TORCH_CHECK(batch_size > 0, "Invalid batch_size: ", batch_size, " (must be > 0)");
  const int64_t n = inputs[0].size(0);
  for (const auto& x : inputs)
    TORCH_CHECK(x.defined() && x.dim() > 0 && x.size(0) == n, "predict: the inputs differ in their number of samples");
  const bool was_training = model.module().is_training();
  model.module().eval();
  torch::NoGradGuard no_grad;
  const torch::Device device = model.module().parameters().empty() ? torch::Device(torch::kCPU)
                                                                   : model.module().parameters()[0].device();
  std::vector<torch::Tensor> outputs;
  try {
    for (int64_t start = 0; start < n; start += batch_size) {
      ModelInputs batch;
      for (const auto& x : inputs) batch.push_back(x.slice(0, start, std::min(n, start + batch_size)).to(device));
      outputs.push_back(model.forward(batch));
    }
  } catch (...) {
    model.module().train(was_training);
    throw;
  }
  model.module().train(was_training);
  return torch::cat(outputs);
}

} // namespace mixtrain
