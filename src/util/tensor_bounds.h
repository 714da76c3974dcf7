#pragma once
// Private: whether tensors read from a file stay inside their storage.
//
// An unpickler that rebuilds a tensor from the sizes, strides and offset the file
// states without checking them against the storage the file holds (libtorch 1.13's,
// which mixtrain supported until 0.2.0, did) leaves a tensor the first op reads out of bounds. torch 2.x's unpickler
// refuses most such tensors itself; every tensor that comes from a file still
// passes through here before anything reads it, and torch's refusal is said in
// the same words (storage_bounds_message).

#include <ATen/core/ivalue.h>

#include <string>
#include <unordered_map>

namespace mixtrain::detail {

/// Throws c10::Error "<what>: tensor <name> claims ... but its storage holds ..."
/// when `t`'s sizes, strides, offset and dtype reach past its storage (or a size
/// or stride is negative).
/// `buffer_sizes`, when given, holds the real size of every buffer the file's
/// records were read into (by address): libtorch sizes a storage by the element
/// count the pickle claims, not by the record the file holds for it, so a storage
/// may claim more bytes than its buffer has. The check then uses the smaller.
/// A storage whose buffer is none of them is refused when `only_records` (a
/// tensor file holds nothing else), and otherwise checked against its own size
/// (a TorchScript module's __setstate__ may build tensors in memory).
void check_tensor_in_storage(const at::Tensor& t, const std::string& what, const std::string& name,
                             const std::unordered_map<const void*, size_t>* buffer_sizes = nullptr,
                             bool only_records = true);

/// The same for every tensor inside `v`: lists, tuples, dicts, and the attributes
/// of objects (a TorchScript module's parameters and submodules). Tensors are
/// named by their path in `v` ("x", "valid_x[1]", "fc.weight").
void check_tensors_in_storage(const c10::IValue& v, const std::string& what, const std::string& name = "",
                              const std::unordered_map<const void*, size_t>* buffer_sizes = nullptr,
                              bool only_records = true);

/// torch 2.x's own refusal while unpickling ("Tensor: sizes 300 7, strides 7 1, storage
/// offset 0 and itemsize 4 require a storage of at least 8400 bytes, but storage only
/// has 2800 bytes"), said as check_tensor_in_storage says it ("a tensor of shape
/// [300, 7] needs 8400 bytes of data but the file holds 2800 for it"); "" for any
/// other message.
std::string storage_bounds_message(const std::string& torch_message);

} // namespace mixtrain::detail
