// libFuzzer target: mixtrain::parse_script (the TorchScript model loader) on
// arbitrary bytes, seeded with real TorchScript files (fuzz/make_scripted_model_seeds.py).
// Any outcome but a module or a c10::Error (our one-line message) is a finding:
// a crash, a sanitizer report, or another exception type escaping. A module that
// loads has every parameter read once, as training would.
#include <mixtrain/models/scripted_model.h>

#include <torch/script.h>

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const torch::jit::Module script = mixtrain::parse_script(std::string(reinterpret_cast<const char*>(data), size), "fuzz-input");
    for (const auto& p : script.parameters())
      if (p.is_floating_point()) (void)p.sum().item<double>();
  } catch (const c10::Error&) {
    // The expected outcome for damaged input.
  }
  return 0;
}
