// Learner::save / Learner::load: checkpoints for exact resume, written atomically.
#include "mixtrain/core/learner.h"

#include "util/archive_util.h"
#include "util/bounded_archive.h"
#include "util/first_line.h"
#include "util/read_file.h"
#include "util/bounded_reader.h"
#include "util/tensor_bounds.h"
#include "mixtrain/util/atomic_file.h"
#include "mixtrain/core/precision_callback.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <cstring>
#include <sstream>
#include <tuple>

#include <zlib.h>

namespace mixtrain {

namespace {

constexpr int64_t kFormatVersion = 1;

// A checkpoint file is a 24-byte header followed by libtorch's archive (a zip):
//   "MIXTRAIN" | u32 container version | u32 CRC-32 of the archive | u64 archive size
// (little endian). libtorch's reader is not hardened against damaged input (a
// fuzzer crashed it with one shuffled byte), so the size and checksum are checked
// first: a truncated or bit-rotted file is reported before libtorch parses a byte.
constexpr char kMagic[8] = {'M', 'I', 'X', 'T', 'R', 'A', 'I', 'N'};
constexpr uint32_t kContainerVersion = 1;
constexpr size_t kHeaderSize = 24;

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

/// `crc` (a CRC-32 so far; by default that of nothing) carried over `size` more bytes.
uint32_t crc32_of(const char* data, size_t size, uLong crc = crc32(0L, Z_NULL, 0)) {
  while (size > 0) {  // zlib takes uInt lengths
    const uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), n);
    data += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
}

/// The 24-byte header of an archive of `size` bytes whose CRC-32 is `crc`.
std::string header_of(uint32_t crc, uint64_t size) {
  std::string out(kMagic, sizeof(kMagic));
  put_le(out, kContainerVersion, 4);
  put_le(out, crc, 4);
  put_le(out, size, 8);
  return out;
}

std::string with_header(const std::string& archive) {
  std::string out = header_of(crc32_of(archive.data(), archive.size()), archive.size());
  out.reserve(kHeaderSize + archive.size());
  out += archive;
  return out;
}

/// Checks the header, size and checksum; returns the archive's bytes.
std::pair<const char*, size_t> checked_archive(const char* data, size_t size, const std::string& path) {
  const size_t magic_seen = std::min(size, sizeof(kMagic));
  TORCH_CHECK(std::memcmp(data, kMagic, magic_seen) == 0, "Checkpoint ", path,
              " is corrupt or truncated (it does not start with the mixtrain checkpoint header)");
  TORCH_CHECK(size >= kHeaderSize, "Checkpoint ", path, " is truncated (", size, " bytes; its header alone is ",
              kHeaderSize, ")");
  const uint64_t version = get_le(data + 8, 4), crc = get_le(data + 12, 4), archive_size = get_le(data + 16, 8);
  TORCH_CHECK(version == kContainerVersion, "Checkpoint ", path, " has container version ", version,
              "; this mixtrain reads version ", kContainerVersion);
  const size_t body = size - kHeaderSize;
  TORCH_CHECK(body >= archive_size, "Checkpoint ", path, " is truncated (", body, " of ", archive_size,
              " archive bytes present)");
  TORCH_CHECK(body == archive_size, "Checkpoint ", path, " is corrupt (", body - archive_size,
              " unexpected bytes after the archive)");
  TORCH_CHECK(crc32_of(data + kHeaderSize, body) == crc, "Checkpoint ", path,
              " is corrupt (checksum mismatch: the file was damaged after it was written)");
  return {data + kHeaderSize, body};
}

using detail::first_line;

std::string precision_tag(const Learner& learn) {
  const auto pc = learn.precision_cb();
  return pc ? pc->mode_tag() : "fp32";
}

std::vector<std::string> split_keys(const std::string& joined) {
  std::vector<std::string> keys;
  std::istringstream in(joined);
  for (std::string k; std::getline(in, k, ',');) keys.push_back(k);
  return keys;
}

std::string joined_state_keys(const std::vector<CallbackPtr>& cbs) {
  std::string keys;
  for (const auto& cb : cbs)
    if (!cb->state_key().empty()) keys += (keys.empty() ? "" : ",") + cb->state_key();
  return keys;
}

/// Lays the optimizer's state map out again, from empty, in parameter order. torch's
/// optimizers save their state in their hash map's iteration order, which depends on the
/// map's history as well as its contents: a refused load clears and refills the map, whose
/// capacity stays, and equal state then saved to other bytes (the records of two parameters
/// swapped places). Laid out so before each save, equal state saves to equal bytes. The
/// state objects themselves are moved, not copied.
void lay_out_state_in_param_order(torch::optim::Optimizer& opt) {
  auto& state = opt.state();
  using Entry = std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>;
  std::vector<Entry> entries;
  entries.reserve(state.size());
  for (const auto& group : opt.param_groups())
    for (const auto& p : group.params()) {
      const auto it = state.find(p.unsafeGetTensorImpl());
      if (it != state.end() && it->second) entries.emplace_back(it->first, std::move(it->second));
    }
  for (auto& kv : state)  // state of a tensor no group holds any more: kept, after the rest
    if (kv.second) entries.emplace_back(kv.first, std::move(kv.second));
  state = std::decay_t<decltype(state)>();
  for (auto& e : entries) state.emplace(e.first, std::move(e.second));
}

/// What loading a checkpoint changes (model tensors, optimizer state, callback
/// states), kept in memory so that a refused load can be undone.
struct Snapshot {
  std::vector<torch::Tensor> model;
  std::string optimizer;
  std::vector<std::pair<CallbackPtr, std::string>> callbacks;
};

std::string archive_bytes(const std::function<void(torch::serialize::OutputArchive&)>& write) {
  torch::serialize::OutputArchive ar;
  write(ar);
  std::ostringstream bytes;
  ar.save_to(bytes);
  return bytes.str();
}

void read_archive_bytes(const std::string& bytes, const std::function<void(torch::serialize::InputArchive&)>& read) {
  torch::serialize::InputArchive ar;
  ar.load_from(bytes.data(), bytes.size());  // trusted: the snapshot this process wrote
  read(ar);
}

Snapshot take_snapshot(Learner& learn, const std::vector<CallbackPtr>& cbs) {
  Snapshot s;
  for (const auto& t : learn.model().state_tensors()) s.model.push_back(t.clone());
  s.optimizer = archive_bytes([&](torch::serialize::OutputArchive& ar) { learn.opt().save(ar); });
  for (const auto& cb : cbs)
    if (!cb->state_key().empty())
      s.callbacks.emplace_back(cb, archive_bytes([&](torch::serialize::OutputArchive& ar) { cb->save_state(ar); }));
  return s;
}

void restore_snapshot(Learner& learn, const Snapshot& s) {
  {
    torch::NoGradGuard no_grad;
    const auto state = learn.model().state_tensors();
    for (size_t i = 0; i < state.size() && i < s.model.size(); ++i) state[i].copy_(s.model[i]);
  }
  // The optimizer's load only adds entries: clear what the refused load put there.
  learn.opt().state().clear();
  read_archive_bytes(s.optimizer, [&](torch::serialize::InputArchive& ar) { learn.opt().load(ar); });
  for (const auto& entry : s.callbacks) {
    Callback& cb = *entry.first;
    read_archive_bytes(entry.second, [&](torch::serialize::InputArchive& ar) { cb.load_state(ar); });
  }
}

} // namespace

void Learner::save(const std::string& path) {
  // A folder that does not exist yet is made, as the CSV logger does.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    TORCH_CHECK(!ec, "Cannot write ", path, ": cannot create its folder ", parent.string(), " (", ec.message(), ")");
  }
  // Streamed into the file: the archive (the model and the optimizer's state, gigabytes for a
  // large model) is never also held as bytes in memory. The header, which sums it up, is
  // written over its placeholder last.
  torch::serialize::OutputArchive ar;
  write_checkpoint_archive(ar);
  uint32_t crc = crc32_of(nullptr, 0);
  uint64_t size = 0;
  write_file_atomically(
      path,
      [&](std::ostream& out) {
        out.write(std::string(kHeaderSize, '\0').data(), kHeaderSize);
        ar.save_to([&](const void* data, size_t n) -> size_t {
          crc = crc32_of(static_cast<const char*>(data), n, crc);
          size += n;
          out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
          return out ? n : 0;
        });
      },
      [&] { return header_of(crc, size); });
}

std::string Learner::save_to_memory() {
  torch::serialize::OutputArchive ar;
  write_checkpoint_archive(ar);
  std::ostringstream bytes;
  ar.save_to(bytes);
  return with_header(bytes.str());
}

void Learner::write_checkpoint_archive(torch::serialize::OutputArchive& ar) {
  detail::write_i64(ar, "mixtrain.format", kFormatVersion);
  ar.write("mixtrain.precision", c10::IValue(precision_tag(*this)));
  ar.write("mixtrain.callbacks", c10::IValue(joined_state_keys(cbs_)));

  torch::NoGradGuard no_grad;
  const auto params = model_.module().named_parameters(/*recurse=*/true);
  const auto buffers = model_.module().named_buffers(/*recurse=*/true);
  detail::write_i64(ar, "model.num_params", static_cast<int64_t>(params.size()));
  detail::write_i64(ar, "model.num_buffers", static_cast<int64_t>(buffers.size()));
  for (const auto& kv : params) ar.write("model.param." + kv.key(), kv.value().detach());
  for (const auto& kv : buffers) ar.write("model.buffer." + kv.key(), kv.value().detach(), /*is_buffer=*/true);

  torch::serialize::OutputArchive opt_ar;
  lay_out_state_in_param_order(opt());
  opt().save(opt_ar);
  ar.write("optimizer", opt_ar);
  for (const auto& cb : cbs_) {
    if (cb->state_key().empty()) continue;
    torch::serialize::OutputArchive sub;
    cb->save_state(sub);
    ar.write("callback." + cb->state_key(), sub);
  }

  // Where to continue. Mid-epoch, the loader must replay this epoch's permutation.
  const Position& now = resume_.now;
  detail::write_i64(ar, "learner.epoch", now.epoch);
  detail::write_i64(ar, "learner.batch", now.batch);
  detail::write_i64(ar, "learner.train_iter", train_iter_);
  detail::write_i64(ar, "learner.n_epoch", n_epoch_);
  detail::write_i64(ar, "learner.param_groups", n_groups());
  detail::write_i64(ar, "learner.frozen_idx", frozen_idx_);
  const bool mid_epoch = now.batch > 0 && now.loader_state.defined();
  ar.write("learner.loader_rng", mid_epoch ? now.loader_state : dls_.train.generator().get_state());
  ar.write("learner.global_rng", at::detail::getDefaultCPUGenerator().get_state());
}

namespace {

/// Checks the header, size and checksum, then opens the archive inside.
void open_archive(const char* data, size_t size, const std::string& path, torch::serialize::InputArchive& ar) {
  TORCH_CHECK(size > 0, "Checkpoint ", path, " is empty");
  std::tie(data, size) = checked_archive(data, size, path);
  // libtorch's reader throws more than c10::Error on damaged input (std::out_of_range
  // from the unpickler, for one); all of it means a corrupt file to the user.
  // Read through a bounded reader that remembers each record's buffer: every
  // storage is checked against the record that holds it below.
  const std::string compressed = detail::first_compressed_storage_record(data, size);
  TORCH_CHECK(compressed.empty(), "Checkpoint ", path, " is corrupt (a compressed storage record, ", compressed,
              ", which torch never writes)");
  const detail::BoundedReader reader(data, size);
  try {
    detail::load_archive_bounded(reader, data, size, ar, "checkpoint");
  } catch (const c10::Error& e) {
    const std::string why = first_line(e.what_without_backtrace());
    const std::string past_storage = detail::storage_bounds_message(why);
    TORCH_CHECK(false, "Checkpoint ", path, " is corrupt or truncated (", past_storage.empty() ? why : past_storage, ")");
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "Checkpoint ", path, " is corrupt or truncated (", first_line(e.what()), ")");
  }
  // Every tensor must fit the storage the file holds before anything reads it.
  detail::check_archive_tensors(ar, reader, "Checkpoint " + path);
}

} // namespace

void Learner::open_checkpoint(const std::string& path, torch::serialize::InputArchive& archive) {
  const std::string bytes = detail::read_whole_file(path, "checkpoint ");
  open_archive(bytes.data(), bytes.size(), path, archive);
}

void Learner::open_checkpoint(const char* data, size_t size, const std::string& name, torch::serialize::InputArchive& archive) {
  open_archive(data, size, name, archive);
}

void Learner::load(const std::string& path) {
  const std::string bytes = detail::read_whole_file(path, "checkpoint ");
  load_from_memory(bytes.data(), bytes.size(), path);
}

void Learner::load_from_memory(const char* data, size_t size, const std::string& path) {
  torch::serialize::InputArchive ar;
  open_archive(data, size, path, ar);
  // Reading an entry can fail too when the archive's body is damaged.
  auto guarded = [&](const std::string& what, const auto& fn) {
    try {
      return fn();
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "Checkpoint ", path, ": ", what, ": ", first_line(e.what_without_backtrace()));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "Checkpoint ", path, ": ", what, ": ", first_line(e.what()));
    }
  };

  // 1. Validate everything before changing anything.
  guarded("format", [&] {
    const int64_t version = detail::read_i64(ar, "mixtrain.format");
    TORCH_CHECK(version == kFormatVersion, "unsupported format version ", version);
    return 0;
  });
  guarded("precision mode", [&] {
    c10::IValue tag;
    TORCH_CHECK(ar.try_read("mixtrain.precision", tag) && tag.isString(), "no precision entry");
    TORCH_CHECK(tag.toStringRef() == precision_tag(*this), "saved in precision mode '", tag.toStringRef(),
                "' but this learner uses '", precision_tag(*this), "'");
    return 0;
  });
  guarded("callbacks", [&] {
    c10::IValue keys;
    TORCH_CHECK(ar.try_read("mixtrain.callbacks", keys) && keys.isString(), "no callback list");
    const std::string saved = keys.toStringRef(), here = joined_state_keys(cbs_);
    if (saved == here) return 0;
    // Name the callback that differs: "data_parallel" tells a user more than two lists.
    auto saved_keys = split_keys(saved), here_keys = split_keys(here);
    // The entries are found by key: the same callbacks attached in another order load alike.
    std::sort(saved_keys.begin(), saved_keys.end());
    std::sort(here_keys.begin(), here_keys.end());
    if (saved_keys == here_keys) return 0;
    for (const auto& k : saved_keys)
      TORCH_CHECK(std::find(here_keys.begin(), here_keys.end(), k) != here_keys.end(), "it holds state for callback '",
                  k, "', which this learner does not have");
    for (const auto& k : here_keys)
      TORCH_CHECK(std::find(saved_keys.begin(), saved_keys.end(), k) != saved_keys.end(),
                  "it holds no state for this learner's callback '", k, "'");
    TORCH_CHECK(false, "saved with stateful callbacks [", saved, "] but this learner has [", here, "]");
    return 0;
  });
  // Each stateful callback's entry, read under an error that names the callback.
  auto for_each_callback_state = [&](const auto& use) {
    for (const auto& cb : cbs_) {
      if (cb->state_key().empty()) continue;
      guarded(cb->state_key() + " state", [&] {
        torch::serialize::InputArchive sub;
        ar.read("callback." + cb->state_key(), sub);
        use(*cb, sub);
        return 0;
      });
    }
  };
  for_each_callback_state([](Callback& cb, torch::serialize::InputArchive& sub) { cb.check_state(sub); });
  std::vector<std::pair<torch::Tensor, torch::Tensor>> model_copies;  // (destination, loaded)
  guarded("model", [&] {
    const auto params = model_.module().named_parameters(/*recurse=*/true);
    const auto buffers = model_.module().named_buffers(/*recurse=*/true);
    TORCH_CHECK(detail::read_i64(ar, "model.num_params") == static_cast<int64_t>(params.size()) &&
                    detail::read_i64(ar, "model.num_buffers") == static_cast<int64_t>(buffers.size()),
                "the model does not match (saved ", detail::read_i64(ar, "model.num_params"), " parameters, this model has ",
                params.size(), ")");
    auto check = [&](const std::string& key, const std::string& name, const torch::Tensor& dest) {
      torch::Tensor t;
      TORCH_CHECK(ar.try_read(key, t), "the model does not match: no saved tensor for '", name, "'");
      TORCH_CHECK(t.sizes() == dest.sizes(), "the model does not match: '", name, "' has shape ", t.sizes(),
                  " in the checkpoint but ", dest.sizes(), " in this model");
      // bf16-pure holds its weights in bf16 tensors while it fits and in fp32 tensors (of
      // bf16 values) between fits, so a checkpoint of either loads into the other.
      const bool bf16_pure_storage = (t.scalar_type() == torch::kBFloat16 && dest.scalar_type() == torch::kFloat) ||
                                     (t.scalar_type() == torch::kFloat && dest.scalar_type() == torch::kBFloat16);
      TORCH_CHECK(t.scalar_type() == dest.scalar_type() || bf16_pure_storage, "the model does not match: '", name,
                  "' is ", t.scalar_type(), " in the checkpoint but ", dest.scalar_type(), " in this model");
      model_copies.emplace_back(dest, t);
    };
    for (const auto& kv : params) check("model.param." + kv.key(), kv.key(), kv.value());
    for (const auto& kv : buffers) check("model.buffer." + kv.key(), kv.key(), kv.value());
    return 0;
  });
  ResumeState::Pending resume;
  torch::Tensor global_rng;
  guarded("training position", [&] {
    resume.at.epoch = detail::read_i64(ar, "learner.epoch");
    resume.at.batch = detail::read_i64(ar, "learner.batch");
    resume.train_iter = detail::read_i64(ar, "learner.train_iter");
    resume.n_epoch = detail::read_i64(ar, "learner.n_epoch");
    resume.at.loader_state = detail::read_tensor(ar, "learner.loader_rng");
    global_rng = detail::read_tensor(ar, "learner.global_rng");
    TORCH_CHECK(resume.at.epoch >= 0 && resume.at.batch >= 0 && resume.train_iter >= 0 && resume.n_epoch >= 0,
                "negative position");
    return 0;
  });
  // Checkpoints from before parameter groups have neither entry: one group, none frozen.
  int64_t frozen_idx = 0;
  guarded("parameter groups", [&] {
    torch::Tensor t;
    const int64_t saved_groups = ar.try_read("learner.param_groups", t) ? t.item<int64_t>() : 1;
    TORCH_CHECK(saved_groups == n_groups(), "saved with ", saved_groups, " parameter group",
                saved_groups == 1 ? "" : "s", " but this learner's splitter makes ", n_groups());
    if (ar.try_read("learner.frozen_idx", t)) frozen_idx = t.item<int64_t>();
    TORCH_CHECK(frozen_idx >= 0 && frozen_idx < saved_groups, "frozen_idx ", frozen_idx, " is out of range");
    return 0;
  });

  // 2. Apply, all or nothing. The optimizer and the callbacks validate their own
  // entries only as they load them, so everything applying can change is kept
  // first and put back when any part is refused.
  const Snapshot before = take_snapshot(*this, cbs_);
  try {
    {
      torch::NoGradGuard no_grad;
      for (auto& [dest, loaded] : model_copies) dest.copy_(loaded);
    }
    for_each_callback_state([](Callback& cb, torch::serialize::InputArchive& sub) { cb.load_state(sub); });
    guarded("optimizer state", [&] {
      torch::serialize::InputArchive opt_ar;
      ar.read("optimizer", opt_ar);
      opt().load(opt_ar);
      return 0;
    });
  } catch (...) {
    restore_snapshot(*this, before);
    throw;
  }
  at::Generator global = at::detail::getDefaultCPUGenerator();  // a handle sharing the global state
  global.set_state(global_rng);
  // Only a change: unfreezing sets requires_grad on every parameter, which would
  // undo a user's own requires_grad(false).
  if (frozen_idx != frozen_idx_) freeze_to(frozen_idx);
  resume_.now = resume.at;
  resume_.pending = std::move(resume);
}

} // namespace mixtrain
