#include "util/tensor_bounds.h"

#include <regex>

#include <ATen/core/Tensor.h>
#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace mixtrain::detail {

namespace {

std::string shape_text(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

/// Objects nest (a module's submodules); a file cannot make the walk recurse without end.
constexpr int kMaxDepth = 256;

void walk(const c10::IValue& v, const std::string& what, const std::string& name, int depth,
          const std::unordered_map<const void*, size_t>* sizes, bool only_records) {
  TORCH_CHECK(depth < kMaxDepth, what, ": values nested more than ", kMaxDepth, " deep");
  const auto child = [&](const std::string& part, bool index) {
    return name.empty() ? part : index ? name + "[" + part + "]" : name + "." + part;
  };
  if (v.isTensor()) {
    check_tensor_in_storage(v.toTensor(), what, name.empty() ? "(top level)" : name, sizes, only_records);
  } else if (v.isTensorList()) {
    const auto list = v.toTensorList();
    for (size_t i = 0; i < list.size(); ++i) check_tensor_in_storage(list.get(i), what, child(std::to_string(i), true), sizes, only_records);
  } else if (v.isList()) {
    const auto list = v.toListRef();
    for (size_t i = 0; i < list.size(); ++i) walk(list[i], what, child(std::to_string(i), true), depth + 1, sizes, only_records);
  } else if (v.isTuple()) {
    const auto& items = v.toTupleRef().elements();
    for (size_t i = 0; i < items.size(); ++i) walk(items[i], what, child(std::to_string(i), true), depth + 1, sizes, only_records);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict())
      walk(kv.value(), what, child(kv.key().isString() ? kv.key().toStringRef() : kv.key().tagKind(), !kv.key().isString()),
           depth + 1, sizes, only_records);
  } else if (v.isObject()) {
    const auto obj = v.toObject();
    const auto type = obj->type();
    for (size_t i = 0; i < obj->slots().size(); ++i)
      walk(obj->getSlot(i), what, child(i < type->numAttributes() ? type->getAttributeName(i) : std::to_string(i), false),
           depth + 1, sizes, only_records);
  }
}

} // namespace

void check_tensor_in_storage(const at::Tensor& t, const std::string& what, const std::string& name,
                             const std::unordered_map<const void*, size_t>* buffer_sizes, bool only_records) {
  if (!t.defined() || t.is_sparse() || t.is_quantized() || t.device().is_meta()) return;
  const auto named = [&] {
    return what + ": tensor '" + name + "' of shape " + shape_text(t);
  };
  int64_t last = 0;  // the furthest element the view reaches, from the storage offset
  bool empty = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t size = t.size(d), stride = t.stride(d);
    TORCH_CHECK(size >= 0 && stride >= 0, named(), " has a negative size or stride: the file is damaged");
    if (size == 0) empty = true;
  }
  if (empty) return;  // reads nothing
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = t.size(d) - 1, stride = t.stride(d);
    TORCH_CHECK(stride == 0 || reach <= (kMax - last) / stride, named(), " reaches past any storage: the file is damaged");
    last += reach * stride;
  }
  const int64_t offset = t.storage_offset();
  const auto item = static_cast<int64_t>(t.element_size());
  TORCH_CHECK(offset >= 0 && last <= kMax - offset - 1 && (last + offset + 1) <= kMax / item, named(),
              " reaches past any storage: the file is damaged");
  const int64_t needed = (offset + last + 1) * item;
  auto held = static_cast<int64_t>(t.storage().nbytes());
  if (buffer_sizes) {
    const auto it = buffer_sizes->find(t.storage().data());
    TORCH_CHECK(it != buffer_sizes->end() || !only_records, named(), " has data that is no record of the file: the file is damaged");
    if (it != buffer_sizes->end()) held = std::min(held, static_cast<int64_t>(it->second));
  }
  TORCH_CHECK(needed <= held, named(), " needs ", needed, " bytes of data but the file holds ", held,
              " for it: the file is damaged or was edited");
}

void check_tensors_in_storage(const c10::IValue& v, const std::string& what, const std::string& name,
                              const std::unordered_map<const void*, size_t>* buffer_sizes, bool only_records) {
  walk(v, what, name, 0, buffer_sizes, only_records);
}

std::string storage_bounds_message(const std::string& torch_message) {
  static const std::regex kTorchWords(
      R"(Tensor: sizes ([0-9 ]*), strides [-0-9 ]*, storage offset [0-9]+ and itemsize [0-9]+ require a storage of at least ([0-9]+) bytes, but storage only has ([0-9]+) bytes)");
  std::smatch m;
  if (!std::regex_search(torch_message, m, kTorchWords)) return "";
  const std::string shape = std::regex_replace(m[1].str(), std::regex(" "), ", ");
  return "a tensor of shape [" + shape + "] needs " + m[2].str() + " bytes of data but the file holds " + m[3].str() +
         " for it";
}

} // namespace mixtrain::detail
