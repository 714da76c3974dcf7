// libFuzzer target: the idx reader on arbitrary bytes, raw and gzipped.
// The first byte picks the framing, so one corpus covers both paths. Any
// outcome but a tensor or a c10::Error is a finding.
#include <mixtrain/data/data.h>

#include <c10/util/Exception.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool gzipped = data[0] & 1;
  try {
    torch::Tensor t = mixtrain::data::parse_idx(data + 1, size - 1, gzipped, "fuzz-input");
    // The tensor must be readable end to end.
    if (t.numel() > 0) (void)t.sum().item<int64_t>();
  } catch (const c10::Error&) {
  }
  return 0;
}
