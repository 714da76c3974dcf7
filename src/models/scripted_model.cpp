// TorchScript models: a loaded torch::jit::Module trained as a torch::nn::Module.
#include "mixtrain/models/scripted_model.h"

#include "util/bounded_reader.h"
#include "util/first_line.h"
#include "util/read_file.h"
#include "util/tensor_bounds.h"
#include "mixtrain/util/atomic_file.h"
#include "mixtrain/compat.h"
#include "mixtrain/models/module_scope.h"
#include "mixtrain/util/option_error.h"

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <unordered_map>
#include <optional>
#include <sstream>

namespace mixtrain {

namespace {

/// "__torch__.torch.nn.modules.conv.___torch_mangle_3.Conv2d" -> "torch.nn.modules.conv.Conv2d".
std::string python_class_of(const torch::jit::Module& m) {
  const auto& qualified = m.type()->name();
  if (!qualified) return "";
  std::string name;
  for (const std::string& part : qualified->atoms())
    if (part != "__torch__" && part.rfind("___torch_mangle_", 0) != 0) name += (name.empty() ? "" : ".") + part;
  return name;
}

/// The root: owns the script and runs its forward.
class ScriptedModel : public ScriptedSubmodule, public detail::ScriptPathResolver {
 public:
  explicit ScriptedModel(torch::jit::Module script) : ScriptedSubmodule(script), script_(std::move(script)) {
    const auto& args = script_.get_method("forward").function().getSchema().arguments();
    for (size_t i = 1; i < args.size(); ++i) {  // 0 is self
      names_ += (i > 1 ? ", " : "") + args[i].name();
      if (!args[i].default_value()) ++min_inputs_;
      ++max_inputs_;
    }
  }

  ModelOutput forward(const ModelInputs& inputs) {
    const auto n = static_cast<int64_t>(inputs.size());
    if (own_loss_ && n == max_inputs_ + 1)
      throw OptionError("loss", Phrase::setting("loss", "model") + " passes the targets as the model's last input, but its forward takes only (" +
                                    names_ + "); a model that computes its loss takes them (labels=None in Hugging Face's models)");
    TORCH_CHECK(n >= min_inputs_ && n <= max_inputs_, "The model's forward takes ",
                min_inputs_ == max_inputs_ ? std::to_string(max_inputs_)
                                           : std::to_string(min_inputs_) + " to " + std::to_string(max_inputs_),
                " input", max_inputs_ == 1 ? "" : "s", " (", names_, ") but the data has ", n,
                own_loss_ ? " (with the targets last)" : "");
    std::vector<c10::IValue> args(inputs.begin(), inputs.end());
    // While the script runs, module boundaries are its module calls (module_scope.h).
    struct Resolving {
      detail::ScriptPathResolver* previous;
      explicit Resolving(detail::ScriptPathResolver* r) : previous(detail::set_script_path_resolver(r)) {}
      ~Resolving() { detail::set_script_path_resolver(previous); }
    } resolving(this);
    // TorchScript's optimizing executor only on a GPU, where fusion comes from, and only
    // when no op must be seen one by one: the emulation, islands and the tracer watch the
    // dispatcher, and autocast is left to the dispatcher's Autocast keys (the executor's own
    // autocast pass differs from eager autocast). On the CPU it fuses nothing and its
    // differentiable graphs cost: the default CNN's step as TorchScript took 1.24x the
    // native module's with it and 1.03x without (torch 2.13, BENCHMARKS.md).
    const bool on_gpu = !inputs.empty() && !inputs.front().device().is_cpu();
    const bool plain = !on_gpu || detail::ops_observed() || compat::is_autocast_enabled(c10::DeviceType::CPU) ||
                       compat::is_autocast_enabled(c10::DeviceType::CUDA);
    const torch::jit::GraphOptimizerEnabledGuard executor(!plain);
    c10::IValue out = script_.forward(std::move(args));
    return output_of(out);
  }

  void select_output(std::string output, bool own_loss) {
    output_ = std::move(output);
    own_loss_ = own_loss;
  }

  /// The prediction the Learner trains on, chosen from what forward returned,
  /// and (for a model that computes its loss) that loss.
  ModelOutput output_of(const c10::IValue& out) {
    ModelOutput result;
    result.described = describe(out);
    const std::string& shape = result.described;
    if (out.isTensor()) {
      if (!output_.empty())
        throw OptionError("output", Phrase::setting("output", output_) + " does not fit: the model returns " + shape);
      result.prediction = out.toTensor();
      // A model that computes its loss may return only the loss: it is then the prediction too (no metrics).
      if (own_loss_ && result.prediction.dim() == 0) result.loss = result.prediction;
      return settle(std::move(result), "");
    }
    if (out.isGenericDict()) {
      const auto dict = out.toGenericDict();
      const auto entry = [&dict](const std::string& key) -> torch::Tensor {
        for (const auto& kv : dict)
          if (kv.key().isString() && kv.key().toStringRef() == key && kv.value().isTensor()) return kv.value().toTensor();
        return {};
      };
      if (own_loss_) result.loss = entry("loss");
      const std::string key = output_.empty() ? "logits" : output_;
      result.prediction = entry(key);
      if (!result.prediction.defined() && own_loss_ && output_.empty() && result.loss.defined() && dict.size() == 1)
        result.prediction = result.loss;  // only a loss
      if (!result.prediction.defined())
        throw OptionError("output", output_.empty() ? "the model returns " + shape +
                                                          " without a 'logits' tensor; choose the prediction with " +
                                                          Phrase::name("output")
                                                    : Phrase::setting("output", output_) + " does not fit: the model returns " + shape);
      const std::string choice = (result.loss.defined() ? "its 'loss' is the loss, " : "") + std::string("training on its '") + key + "'";
      return settle(std::move(result), choice);
    }
    if (out.isTuple() || out.isList()) {
      const std::vector<c10::IValue> items = out.isTuple() ? out.toTupleRef().elements().vec() : out.toListRef().vec();
      std::vector<std::string> names;  // a namedtuple's fields
      if (out.isTuple())
        if (const auto schema = out.toTupleRef().type()->schema())
          for (const auto& a : schema->arguments()) names.push_back(a.name());
      // Hugging Face's tuple outputs given labels put the loss first: (loss, logits, ...).
      int64_t loss_index = -1;
      if (own_loss_)
        for (size_t i = 0; i < items.size() && loss_index < 0; ++i)
          if (items[i].isTensor()) loss_index = items[i].toTensor().dim() == 0 ? static_cast<int64_t>(i) : -2;
      if (loss_index >= 0) result.loss = items[static_cast<size_t>(loss_index)].toTensor();
      int64_t index = -1;
      if (output_.empty()) {
        for (size_t i = 0; i < items.size() && index < 0; ++i)
          if (items[i].isTensor() && static_cast<int64_t>(i) != loss_index) index = static_cast<int64_t>(i);  // None, ints are passed over
      } else {
        for (size_t i = 0; i < names.size(); ++i)
          if (names[i] == output_) index = static_cast<int64_t>(i);
        char* end = nullptr;
        const long n = std::strtol(output_.c_str(), &end, 10);
        if (index < 0 && end && *end == '\0' && n >= 0) index = n;
      }
      if (index < 0 || index >= static_cast<int64_t>(items.size()) || !items[static_cast<size_t>(index)].isTensor())
        throw OptionError("output", output_.empty() ? Phrase("the model returns " + shape + " with no tensor to train on")
                                                    : Phrase::setting("output", output_) + " does not fit: the model returns " + shape);
      result.prediction = items[static_cast<size_t>(index)].toTensor();
      const std::string choice =
          (loss_index >= 0 ? "element " + std::to_string(loss_index) + " is the loss, " : std::string()) +
          "training on element " + std::to_string(index) +
          (static_cast<size_t>(index) < names.size() ? " ('" + names[static_cast<size_t>(index)] + "')" : "") +
          (output_.empty() ? " (the output option chooses another)" : "");
      return settle(std::move(result), choice);
    }
    throw OptionError("output", output_.empty() ? Phrase("the model's forward returned " + shape + "; mixtrain trains on a tensor")
                                                : Phrase::setting("output", output_) + " does not fit: the model returns " + shape);
  }

  /// The end of output_of for every shape: with the targets passed a loss was
  /// due (checked before the notice, so the error is one line), then the choice is
  /// said once (`choice` empty: a plain tensor, nothing to say).
  ModelOutput settle(ModelOutput result, const std::string& choice) {
    if (own_loss_ && !result.loss.defined()) detail::throw_no_model_loss(result.described);
    if (!choice.empty()) notice("the model returns " + result.described + "; " + choice);
    return result;
  }

  void train(bool on) override {
    script_.train(on);
    torch::nn::Module::train(on);
  }
  // Device moves go through the script too, so tensors it holds outside its
  // parameters and buffers (constants of a traced graph, plain attributes) move.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking) override {
    script_.to(device, dtype, non_blocking);
    torch::nn::Module::to(device, dtype, non_blocking);
  }
  void to(torch::Dtype dtype, bool non_blocking) override {
    script_.to(dtype, non_blocking);
    torch::nn::Module::to(dtype, non_blocking);
  }
  void to(torch::Device device, bool non_blocking) override {
    script_.to(device, non_blocking);
    torch::nn::Module::to(device, non_blocking);
  }

  const torch::jit::Module& script() const { return script_; }

  /// "a tensor", "a dict with keys logits, loss", "a tuple of 2 (Tensor, int)", "a namedtuple (logits, aux)".
  static std::string describe(const c10::IValue& v) {
    if (v.isTensor()) return "a tensor";
    if (v.isGenericDict()) {
      std::string keys;
      for (const auto& kv : v.toGenericDict())
        keys += (keys.empty() ? "" : ", ") + (kv.key().isString() ? kv.key().toStringRef() : kv.key().tagKind());
      return "a dict with keys " + keys;
    }
    if (v.isTuple() || v.isList()) {
      const std::vector<c10::IValue> items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec();
      std::vector<std::string> names;
      if (v.isTuple())
        if (const auto schema = v.toTupleRef().type()->schema())
          for (const auto& a : schema->arguments()) names.push_back(a.name());
      std::string parts;
      for (size_t i = 0; i < items.size(); ++i)
        parts += (i ? ", " : "") + (i < names.size() ? names[i] + ": " : std::string()) +
                 (items[i].isTensor() ? std::string("Tensor") : items[i].isNone() ? std::string("None") : items[i].tagKind());
      return std::string(names.empty() ? (v.isTuple() ? "a tuple" : "a list") : "a namedtuple") + " of " +
             std::to_string(items.size()) + " (" + parts + ")";
    }
    return std::string("a ") + v.tagKind();
  }

  void notice(const std::string& text) {
    if (noticed_) return;
    noticed_ = true;
    std::cerr << "mixtrain: notice: " << text << std::endl;
  }

  /// The interpreter names a module call by its instance name, which for an
  /// element of a ModuleList or ModuleDict (they have no forward of their own)
  /// leaves the container out: "0(Block)" under "layers". Such a name is looked
  /// for inside the container children whose element's class matches.
  std::string resolve(const std::vector<std::pair<std::string, std::string>>& calls) override {
    std::string key;
    for (const auto& [name, cls] : calls) key += name + "(" + cls + ")/";
    const auto hit = resolved_.find(key);
    if (hit != resolved_.end()) return hit->second;
    const torch::nn::Module* node = this;
    std::string path;
    for (const auto& [name, cls] : calls) {
      std::shared_ptr<torch::nn::Module> next;
      std::string step = name;
      for (const auto& child : node->named_children())
        if (child.key() == name) next = child.value();
      if (!next)
        for (const auto& container : node->named_children())
          for (const auto& item : container.value()->named_children()) {
            const auto* s = dynamic_cast<const ScriptedSubmodule*>(item.value().get());
            const std::string& c = s ? s->python_class() : std::string();
            if (item.key() == name && !next && (cls.empty() || (c.size() >= cls.size() && c.compare(c.size() - cls.size(), cls.size(), cls) == 0))) {
              next = item.value();
              step = container.key() + "." + name;
            }
          }
      if (!next) break;  // not a module of ours (a function's frame): the path so far
      path += (path.empty() ? "" : ".") + step;
      node = next.get();
    }
    return resolved_[key] = path;
  }

 private:
  std::unordered_map<std::string, std::string> resolved_;  // the interpreter's call chain -> Python path
  std::string output_;    // which part of a structured output is the prediction ("": the default rule)
  bool own_loss_ = false; // the targets are the last input and the output carries the loss
  bool noticed_ = false;  // the choice is said once
  torch::jit::Module script_;
  std::string names_;
  int64_t min_inputs_ = 0, max_inputs_ = 0;
};

} // namespace

ScriptedSubmodule::ScriptedSubmodule(const torch::jit::Module& script)
    : ScriptedSubmodule(script, std::make_shared<std::unordered_set<const void*>>()) {}

ScriptedSubmodule::ScriptedSubmodule(const torch::jit::Module& script,
                                     const std::shared_ptr<std::unordered_set<const void*>>& registered)
    : python_class_(python_class_of(script)) {
  for (const auto& p : script.named_parameters(/*recurse=*/false))
    if (registered->insert(p.value.unsafeGetTensorImpl()).second) register_parameter(p.name, p.value, p.value.requires_grad());
  for (const auto& b : script.named_buffers(/*recurse=*/false))
    if (registered->insert(b.value.unsafeGetTensorImpl()).second) register_buffer(b.name, b.value);
  for (const auto& c : script.named_children())
    register_module(c.name, std::make_shared<ScriptedSubmodule>(c.value, registered));
}

Model scripted_model(torch::jit::Module script, const std::string& output, bool computes_loss, const std::string& name) {
  TORCH_CHECK(script.find_method("forward"), name, " has no forward method");
  for (const auto& p : script.named_parameters())
    TORCH_CHECK(p.value.is_floating_point(), name, ": parameter '", p.name, "' is ", p.value.scalar_type(),
                "; mixtrain trains floating-point parameters");
  auto module = std::make_shared<ScriptedModel>(std::move(script));
  module->select_output(output, computes_loss);
  TORCH_CHECK(!module->parameters().empty(), name, " has no parameters to train");
  // The forward's own check names the inputs, so the Model takes any count.
  return Model(module, [module](const ModelInputs& in) { return module->forward(in); }, -1, computes_loss);
}

Model load_scripted_model(const std::string& path, const std::string& output, bool computes_loss) {
  std::error_code ec;
  TORCH_CHECK(std::filesystem::is_regular_file(path, ec), "Model file not found: ", path);
  return scripted_model(parse_script(detail::read_whole_file(path, "model file "), path), output, computes_loss, path);
}

namespace {
/// Whether `bytes` is a zip archive torch.save wrote: a pickle (data.pkl) and no TorchScript
/// code or constants beside it.
bool saved_by_torch_save(const std::string& bytes) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<detail::BoundedReader>(bytes));
    bool pickle = false, code = false;
    for (const auto& name : reader.getAllRecords()) {
      pickle |= name == "data.pkl";
      code |= name == "constants.pkl" || name.rfind("code/", 0) == 0;
    }
    return pickle && !code;
  } catch (const std::exception&) {
    return false;  // not a zip torch reads: the caller says what is wrong
  }
}
} // namespace

torch::jit::Module parse_script(const std::string& bytes, const std::string& path) {
  const std::string compressed = detail::first_compressed_storage_record(bytes.data(), bytes.size());
  TORCH_CHECK(compressed.empty(), path, " holds a compressed storage record (", compressed,
              "), which torch never writes: save the model again with torch.jit.save");
  const auto reader = std::make_shared<detail::BoundedReader>(bytes);
  torch::jit::Module script;
  try {
    detail::check_pickles_in(bytes.data(), bytes.size());
    script = torch::jit::load(reader);
  } catch (const c10::Error& e) {
    TORCH_CHECK(!saved_by_torch_save(bytes), path, " is a torch.save'd file (a state_dict or a pickled module), not "
                "TorchScript: mixtrain needs the model's code as well as its weights; load the weights into the model "
                "and save it with torch.jit.script(model).save(path) (or torch.jit.trace), or from Python pass the "
                "module itself (mixtrain.train(model, data))");
    TORCH_CHECK(false, path, " is not a TorchScript file (write one with torch.jit.script(model).save(path) ",
                "or torch.jit.trace): ", detail::first_line(e.what()));
  } catch (const std::exception& e) {  // the unpickler throws more than c10::Error on damaged input
    TORCH_CHECK(false, path, " is not a TorchScript file, or is damaged: ", detail::first_line(e.what()));
  }
  // Its parameters and buffers must fit the records the file holds for them before
  // anything reads them (a __setstate__ may build tensors in memory: those are not records).
  detail::check_tensors_in_storage(c10::IValue(script._ivalue()), path, "", &reader->buffer_sizes(), /*only_records=*/false);
  return script;
}

bool is_scripted(const Model& model) { return dynamic_cast<const ScriptedModel*>(model.ptr().get()) != nullptr; }

void save_scripted_model(const Model& model, const std::string& path) {
  const auto* scripted = dynamic_cast<const ScriptedModel*>(model.ptr().get());
  TORCH_CHECK(scripted, "save_scripted_model: the model was not loaded from TorchScript");
  // fp32 on the CPU whatever trained it (master weights keep the model in half). A model
  // that is so already is written as it is: a copy would hold the weights twice.
  const torch::jit::Module& trained = scripted->script();
  const auto stored = [](const at::Tensor& t) { return t.is_cpu() && (!t.is_floating_point() || t.scalar_type() == torch::kFloat); };
  bool as_it_is = true;
  for (const auto& p : trained.named_parameters()) as_it_is = as_it_is && stored(p.value);
  for (const auto& b : trained.named_buffers()) as_it_is = as_it_is && stored(b.value);
  std::optional<torch::jit::Module> copy;
  if (!as_it_is) {
    copy = trained.clone();
    for (const auto& p : copy->named_parameters())
      if (p.value.is_floating_point() && p.value.scalar_type() != torch::kFloat) p.value.set_data(p.value.to(torch::kFloat));
    for (const auto& b : copy->named_buffers())
      if (b.value.is_floating_point() && b.value.scalar_type() != torch::kFloat) b.value.set_data(b.value.to(torch::kFloat));
    copy->to(torch::kCPU);
  }
  // Streamed into the file: no copy of its bytes in memory either.
  write_file_atomically(path, [&](std::ostream& out) { (copy ? *copy : trained).save(out); });
}

} // namespace mixtrain
