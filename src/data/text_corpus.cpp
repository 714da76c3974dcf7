// The built-in transformer's data: a character-level corpus from text files.
#include "mixtrain/data/data.h"

#include "util/read_file.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace mixtrain::data {

namespace {

bool is_fortune_index(const std::filesystem::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".dat" || ext == ".u8";
}

/// The text of `path`: the file itself, or its directory's text files in name order.
std::string read_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return detail::read_whole_file(path, "text file ");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file() && !e.is_symlink() && !is_fortune_index(e.path())) files.push_back(e.path());
  TORCH_CHECK(!ec, "Cannot list ", path, ": ", ec.message());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) text += detail::read_whole_file(f.string(), "text file ");
  return text;
}

/// Consecutive, non-overlapping samples of `context` tokens and their next tokens.
Dataset windows(const std::string& text, int64_t context) {
  const int64_t n = (static_cast<int64_t>(text.size()) - 1) / context;
  if (n <= 0) return {at::empty({0, context}, at::kLong), at::empty({0, context}, at::kLong)};
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  const at::Tensor tokens = bytes.to(at::kLong);
  return {tokens.slice(0, 0, n * context).view({n, context}).clone(),
          tokens.slice(0, 1, n * context + 1).view({n, context}).clone()};
}

} // namespace

DatasetSplit text_corpus(const std::string& path, int64_t context, double valid_fraction) {
  TORCH_CHECK(context > 0, "Invalid context: ", context, " (must be > 0)");
  TORCH_CHECK(valid_fraction > 0 && valid_fraction < 1, "Invalid valid_fraction: ", valid_fraction,
              " (must be in (0, 1))");
  std::error_code ec;
  TORCH_CHECK(std::filesystem::exists(path, ec), "Text corpus not found: ", path,
              path == kFortunesDir ? " (install Debian's 'fortunes' package)" : "");
  const std::string text = read_text(path);
  const auto cut = static_cast<size_t>(static_cast<double>(text.size()) * (1 - valid_fraction));
  DatasetSplit split{windows(text.substr(0, cut), context), windows(text.substr(cut), context)};
  TORCH_CHECK(split.train.size() > 0 && split.valid.size() > 0, path, " holds ", text.size(),
              " bytes: too little text for samples of ", context, " characters");
  return split;
}

double unigram_perplexity(const DatasetSplit& split) {
  // Add-one smoothing, so a character unseen in training does not make it infinite.
  const at::Tensor counts = at::bincount(split.train.y.flatten(), {}, 256).to(at::kDouble) + 1;
  const at::Tensor log_p = (counts / counts.sum()).log();
  const double nll = -log_p.index_select(0, split.valid.y.flatten()).mean().item<double>();
  return std::exp(nll);
}

} // namespace mixtrain::data
