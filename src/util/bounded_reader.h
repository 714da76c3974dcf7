#pragma once
// Private: a file's bytes for libtorch's zip reader (caffe2's PyTorchStreamReader),
// bounded, and recording where each read landed.
//
// Bounded: the reader may ask past the end of a damaged file, and caffe2's
// MemoryReadAdapter would copy from there (the tensor_file fuzzer's find).
//
// Recording: libtorch sizes a storage by the element count the pickle claims, not
// by the record the file holds for it, so a damaged file can make a storage claim
// more bytes than its buffer has (reads and writes past it: heap corruption). The
// reader reads a stored (uncompressed) record straight into the buffer the storage
// will own, in one read of the record's size, so the last read into an address is
// the size of the buffer there: check_tensors_in_storage takes that map.

#include "util/pickle_check.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

namespace mixtrain::detail {

/// The name of the first storage record (`data/<digits>` in an archive's folder) of the zip
/// in `data` that is compressed, or "" when there is none or the directory cannot be
/// read (then libtorch's reader says what is wrong). torch writes its storage records
/// stored (its code records deflated); a compressed storage record would be inflated
/// into a buffer this reader never sees, so its size could not be checked.
inline std::string first_compressed_storage_record(const char* data, size_t size) {
  const auto u16 = [&](size_t at) { return at + 2 <= size ? uint32_t(uint8_t(data[at])) | uint32_t(uint8_t(data[at + 1])) << 8 : 0u; };
  const auto u32 = [&](size_t at) { return at + 4 <= size ? u16(at) | u16(at + 2) << 16 : 0u; };
  const auto u64 = [&](size_t at) { return at + 8 <= size ? uint64_t(u32(at)) | uint64_t(u32(at + 4)) << 32 : 0u; };
  // The end-of-central-directory record: 22 bytes and a comment of at most 64 KiB.
  if (size < 22) return {};
  size_t end = size - 22;
  const size_t lowest = size > 22 + 65535 ? size - 22 - 65535 : 0;
  while (u32(end) != 0x06054b50u) {
    if (end == lowest) return {};
    --end;
  }
  uint64_t entries = u16(end + 10), at = u32(end + 16);
  if (end >= 20 && u32(end - 20) == 0x07064b50u) {  // zip64: the locator names the zip64 end record
    const uint64_t end64 = u64(end - 20 + 8);
    if (end64 + 56 > size || u32(static_cast<size_t>(end64)) != 0x06064b50u) return {};
    entries = u64(static_cast<size_t>(end64) + 32);
    at = u64(static_cast<size_t>(end64) + 48);
  }
  for (uint64_t i = 0; i < entries && at + 46 <= size; ++i) {
    if (u32(static_cast<size_t>(at)) != 0x02014b50u) return {};
    const auto entry = static_cast<size_t>(at);
    const uint32_t method = u16(entry + 10), name_length = u16(entry + 28);
    if (entry + 46 + name_length > size) return {};
    const std::string name(data + entry + 46, name_length);
    // A storage record is data/<key> (or .data/<key>) in an archive's folder, its key digits.
    const size_t slash = name.rfind('/');
    const std::string key = slash == std::string::npos ? name : name.substr(slash + 1);
    const std::string folder = slash == std::string::npos ? "" : name.substr(0, slash);
    const std::string parent = folder.substr(folder.rfind('/') == std::string::npos ? 0 : folder.rfind('/') + 1);
    const bool storage = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
                         (parent == "data" || parent == ".data");
    if (method != 0 && storage) return name;
    at += 46 + name_length + u16(entry + 30) + u16(entry + 32);
  }
  return {};
}

class BoundedReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  BoundedReader(const char* data, size_t size) : data_(data), size_(size) {}
  explicit BoundedReader(const std::string& bytes) : BoundedReader(bytes.data(), bytes.size()) {}
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= size_) return 0;
    n = std::min<size_t>(n, size_ - static_cast<size_t>(pos));
    // miniz reads an empty record into no buffer (null, 0 bytes): memcpy's arguments
    // must not be null even then (UBSan; CI's tensor_file fuzzer found it).
    if (n == 0 || buf == nullptr) return 0;
    std::memcpy(buf, data_ + pos, n);
    buffer_sizes_[buf] = n;
    return n;
  }
  /// The size of the last read into each address.
  const std::unordered_map<const void*, size_t>& buffer_sizes() const { return buffer_sizes_; }

 private:
  const char* data_;
  size_t size_;
  mutable std::unordered_map<const void*, size_t> buffer_sizes_;
};

/// Walks every pickle of the zip in `data` (data.pkl, constants.pkl, a model's debug
/// pickles) with check_pickle before libtorch's unpickler reads them: see pickle_check.h.
inline void check_pickles_in(const char* data, size_t size) {
  caffe2::serialize::PyTorchStreamReader archive(std::make_unique<BoundedReader>(data, size));
  for (const auto& name : archive.getAllRecords()) {
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".pkl") != 0) continue;
    at::DataPtr pickle;
    size_t n = 0;
    std::tie(pickle, n) = archive.getRecord(name);
    check_pickle(static_cast<const char*>(pickle.get()), n);
  }
}

} // namespace mixtrain::detail
