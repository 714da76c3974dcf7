// libFuzzer target: Learner::load_from_memory on arbitrary bytes. Built twice: as
// checkpoint_fuzz (an fp16 Learner) and, with MIXTRAIN_FUZZ_PURE_BF16, as
// pure_bf16_checkpoint_fuzz (bf16-pure on bf16 storage, Kahan).
// Any outcome but a successful load or a c10::Error (our one-line message) is a
// finding: a crash, a sanitizer report, or another exception type escaping.
//
// `checkpoint_fuzz -write_seed=DIR` writes a valid checkpoint of the fuzz
// Learner into DIR (the starting corpus) and exits.
#include "fuzz_learner.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace {
mixtrain::Learner* g_learn = nullptr;
#ifdef MIXTRAIN_FUZZ_PURE_BF16
constexpr bool kPureBf16 = true;
#else
constexpr bool kPureBf16 = false;
#endif
} // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  static std::unique_ptr<mixtrain::Learner> learn = mixtrain::fuzz::make_fuzz_learner(kPureBf16);
  g_learn = learn.get();
  for (int i = 1; i < *argc; ++i) {
    const char* flag = "-write_seed=";
    if (std::strncmp((*argv)[i], flag, std::strlen(flag)) != 0) continue;
    const std::string dir = (*argv)[i] + std::strlen(flag);
    // Optimizer state (and fp16's scale history) worth storing, saved inside the fit.
    learn->fit(1, 1e-2, {std::make_shared<mixtrain::fuzz::SaveAtFirstEpochEnd>(dir + "/trained.pt")});
    // A seed the fuzz Learner refused would keep the fuzzer at the door: it must load.
    mixtrain::fuzz::make_fuzz_learner(kPureBf16)->load(dir + "/trained.pt");
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    g_learn->load_from_memory(reinterpret_cast<const char*>(data), size, "fuzz-input");
  } catch (const c10::Error&) {
    // The expected outcome for damaged input.
  }
  return 0;
}
