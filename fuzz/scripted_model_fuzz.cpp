// libFuzzer target: mixtrain::parse_script (the TorchScript model loader) on models
// whose data is damaged. A TorchScript model is a program: its code records are
// compiled at load, and libtorch's compiler is not hardened against hostile source,
// so loading a model means trusting its code as one trusts any program. What must
// not crash is a real model whose *data* was damaged or edited: its pickles
// (data.pkl, constants.pkl) and its storage records. So an input is either
//   - structured: [seed][record][bytes]: one non-code record of a seed model
//     (fuzz/seeds/scripted_model, real TorchScript files) replaced by the bytes; or
//   - a whole model file (it starts with a zip's magic), taken only when its code
//     records are a seed's, byte for byte: the crafted regression files.
// Any outcome but a module or a c10::Error (our one-line message) is a finding.
//
// `scripted_model_fuzz -write_seed=DIR` writes the structured inputs that reproduce
// every record of every seed unchanged into DIR (the starting corpus) and exits.
#include <mixtrain/models/scripted_model.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/script.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Records = std::map<std::string, std::string>;  // name (without the archive folder) -> bytes

Records records_of(const std::string& bytes) {
  std::istringstream in(bytes);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  Records out;
  for (const auto& name : reader.getAllRecords()) {
    // The harness's own read, unbounded unlike parse_script's (BoundedReader): a size field
    // edited to gigabytes would make it allocate them. Seeds' records are stored, never
    // larger than the file.
    TORCH_CHECK(reader.getRecordSize(name) <= bytes.size(), "record ", name, " claims more bytes than the file");
    at::DataPtr data;
    size_t n = 0;
    std::tie(data, n) = reader.getRecord(name);
    out[name] = std::string(static_cast<const char*>(data.get()), n);
  }
  return out;
}

std::string zip_of(const Records& records) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  for (const auto& [name, bytes] : records)
    if (name != ".data/version" && name != "version") writer.writeRecord(name, bytes.data(), bytes.size());
  writer.writeEndOfFile();
  return out;
}

bool is_code(const std::string& name) { return name.rfind("code/", 0) == 0; }

std::vector<Records> g_seeds;

void load(const std::string& bytes) {
  try {
    (void)mixtrain::parse_script(bytes, "fuzz-input");
  } catch (const c10::Error&) {
    // The expected outcome for damaged input.
  }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (const auto& entry : std::filesystem::directory_iterator(MIXTRAIN_SOURCE_DIR "/fuzz/seeds/scripted_model")) {
    std::ifstream f(entry.path(), std::ios::binary);
    g_seeds.push_back(records_of(std::string(std::istreambuf_iterator<char>(f), {})));
  }
  for (int i = 1; i < *argc; ++i) {
    const char* flag = "-write_seed=";
    if (std::strncmp((*argv)[i], flag, std::strlen(flag)) != 0) continue;
    const std::string dir = (*argv)[i] + std::strlen(flag);
    for (size_t s = 0; s < g_seeds.size(); ++s) {
      size_t r = 0;
      for (const auto& [name, bytes] : g_seeds[s]) {
        if (is_code(name)) continue;
        std::ofstream(dir + "/seed-" + std::to_string(s) + "-" + std::to_string(r), std::ios::binary)
            << static_cast<char>(s) << static_cast<char>(r) << bytes;
        ++r;
      }
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  if (input.rfind("PK\x03\x04", 0) == 0) {  // a whole model file: only with a seed's code
    Records records;
    try {
      records = records_of(input);
    } catch (const c10::Error&) {
      return 0;
    }
    bool known_code = false;
    for (const auto& seed : g_seeds) {
      bool same = true, any = false;
      for (const auto& [name, bytes] : records)
        if (is_code(name)) {
          any = true;
          const auto it = seed.find(name);
          same = same && it != seed.end() && it->second == bytes;
        }
      known_code = known_code || (any && same);
    }
    if (known_code) load(input);
    return 0;
  }
  if (size < 2 || g_seeds.empty()) return 0;
  Records records = g_seeds[static_cast<uint8_t>(data[0]) % g_seeds.size()];
  std::vector<std::string> data_records;
  for (const auto& [name, bytes] : records)
    if (!is_code(name)) data_records.push_back(name);
  if (data_records.empty()) return 0;
  records[data_records[static_cast<uint8_t>(data[1]) % data_records.size()]] = input.substr(2);
  load(zip_of(records));
  return 0;
}
