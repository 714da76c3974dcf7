// libFuzzer target: data::parse_tensor_file on arbitrary bytes (what --data and
// load_tensor_file read: a dict written by torch.save).
// Any outcome but a split or a c10::Error (our one-line message) is a finding: a
// crash, a sanitizer report, or another exception type escaping. Every element of
// an accepted split is read, so a tensor that reaches past its storage is an
// ASan report here, not a quiet read of someone else's memory.
#include <mixtrain/data/data.h>

#include <ATen/ATen.h>

#include <string>

namespace {
void touch(const at::Tensor& t) {
  if (t.defined() && t.numel() > 0) (void)t.to(at::kDouble).sum().item<double>();
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto split =
        mixtrain::data::parse_tensor_file(std::string(reinterpret_cast<const char*>(data), size), "fuzz-input");
    for (const auto* d : {&split.train, &split.valid}) {
      touch(d->x);
      touch(d->y);
      for (const auto& e : d->extra_x) touch(e);
    }
  } catch (const c10::Error&) {
    // The expected outcome for damaged input.
  }
  return 0;
}
