#pragma once
// Private: a torch::serialize archive loaded as every file libtorch unpickles is
// (ARCHITECTURE.md): its pickles walked first (pickle_check.h), its records read through a
// BoundedReader, and every tensor in it checked against the record it was read from
// (tensor_bounds.h). Checkpoints and built-in models' files use it; each says its own errors.

#include "util/bounded_reader.h"
#include "util/tensor_bounds.h"

#include <torch/serialize/input-archive.h>

#include <cstddef>
#include <string>

namespace mixtrain::detail {

/// Loads `ar` from `data`, the bytes `reader` holds, after walking their pickles. Throws what
/// libtorch's reader throws on damaged input (c10::Error, and more than c10::Error).
inline void load_archive_bounded(const BoundedReader& reader, const char* data, size_t size,
                                 torch::serialize::InputArchive& ar, const char* what) {
  check_pickles_in(data, size);
  ar.load_from([&](uint64_t pos, void* buf, size_t n) { return reader.read(pos, buf, n, what); },
               [&] { return reader.size(); });
}

/// Checks every tensor of every entry of `ar` against the record `reader` read it into;
/// `file` names the file in the error ("Checkpoint runs/x/checkpoint-3.pt").
inline void check_archive_tensors(torch::serialize::InputArchive& ar, const BoundedReader& reader, const std::string& file) {
  for (const auto& key : ar.keys()) {
    c10::IValue entry;
    if (ar.try_read(key, entry)) check_tensors_in_storage(entry, file, key, &reader.buffer_sizes(), /*only_records=*/false);
  }
}

} // namespace mixtrain::detail
