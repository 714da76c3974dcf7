// libFuzzer target: Learner::load_from_memory on arbitrary bytes.
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
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  static std::unique_ptr<mixtrain::Learner> learn = mixtrain::fuzz::make_fuzz_learner();
  g_learn = learn.get();
  for (int i = 1; i < *argc; ++i) {
    const char* flag = "-write_seed=";
    if (std::strncmp((*argv)[i], flag, std::strlen(flag)) != 0) continue;
    const std::string dir = (*argv)[i] + std::strlen(flag);
    learn->fit(1, 1e-2);  // optimizer state and a scale history worth storing
    learn->save(dir + "/trained.pt");
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
