#include "mixtrain/data/data.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <zlib.h>

#include "util/read_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

namespace mixtrain::data {

Dataset Dataset::head(int64_t n) const {
  TORCH_CHECK(n >= 0, "Invalid head size: ", n, " (must be >= 0)");
  if (n >= size()) return *this;
  Dataset d{x.slice(0, 0, n), y.slice(0, 0, n)};
  for (const auto& e : extra_x) d.extra_x.push_back(e.slice(0, 0, n));
  return d;
}

std::vector<torch::Tensor> Batch::inputs() const {
  std::vector<torch::Tensor> in{x};
  in.insert(in.end(), extra_x.begin(), extra_x.end());
  return in;
}

Batch Batch::head_of(const Dataset& ds, int64_t n) {
  const Dataset head = ds.head(n);
  return {head.x, head.y, head.extra_x};
}

Batch Batch::to(torch::Device device) const {
  Batch b{x.to(device), y.to(device)};
  for (const auto& e : extra_x) b.extra_x.push_back(e.to(device));
  return b;
}

DataLoader::DataLoader(Dataset dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options),
      generator_(at::detail::createCPUGenerator(options.seed())) {
  TORCH_CHECK(options_.batch_size() > 0, "Invalid batch_size: ", options_.batch_size(), " (must be > 0)");
  TORCH_CHECK(dataset_.x.defined() && dataset_.y.defined(), "DataLoader needs a dataset with x and y");
  TORCH_CHECK(dataset_.x.size(0) == dataset_.y.size(0), "Dataset x has ", dataset_.x.size(0),
              " samples but y has ", dataset_.y.size(0));
  for (size_t i = 0; i < dataset_.extra_x.size(); ++i)
    TORCH_CHECK(dataset_.extra_x[i].defined() && dataset_.extra_x[i].dim() > 0 &&
                    dataset_.extra_x[i].size(0) == dataset_.x.size(0),
                "Dataset input ", i + 2, " does not have x's ", dataset_.x.size(0), " samples");
}

void DataLoader::set_sharding(int64_t num_shards, int64_t shard) {
  TORCH_CHECK(num_shards >= 1 && shard >= 0 && shard < num_shards, "Invalid sharding: shard ", shard, " of ",
              num_shards);
  options_.num_shards(num_shards).shard(shard);
}

int64_t DataLoader::num_batches() const {
  const int64_t n = dataset_.size(), bs = options_.batch_size() * options_.num_shards();
  return options_.drop_last() ? n / bs : (n + bs - 1) / bs;
}

DataLoader::Iterator DataLoader::begin() {
  torch::Tensor order;
  if (options_.shuffle()) order = at::randperm(dataset_.size(), generator_, at::kLong);
  return Iterator(this, 0, std::move(order));
}

Batch DataLoader::Iterator::operator*() const {
  const Dataset& ds = loader_->dataset_;
  const int64_t bs = loader_->options_.batch_size();
  const int64_t global = bs * loader_->options_.num_shards();
  const int64_t start = std::min(index_ * global + loader_->options_.shard() * bs, ds.size());
  const int64_t stop = std::min(start + bs, ds.size());
  // index_select gathers into a fresh contiguous batch: one copy, no per-sample work.
  torch::Tensor idx = order_.defined() ? order_.slice(0, start, stop) : torch::Tensor();
  // The order is drawn on the CPU; a dataset kept on the GPU takes its indices there, moved
  // once a batch (a tensor on yet another device moves them for itself).
  if (idx.defined() && ds.x.defined() && idx.device() != ds.x.device()) idx = idx.to(ds.x.device());
  const auto take = [&](const torch::Tensor& t) {
    if (!idx.defined()) return t.slice(0, start, stop);
    return t.index_select(0, idx.device() == t.device() ? idx : idx.to(t.device()));
  };
  Batch b{take(ds.x), take(ds.y)};
  for (const auto& e : ds.extra_x) b.extra_x.push_back(take(e));
  return b;
}

DataLoaders DataLoaders::from_split(const DatasetSplit& split, int64_t batch_size, uint64_t seed) {
  return DataLoaders(
      DataLoader(split.train, DataLoaderOptions().batch_size(batch_size).shuffle(true).drop_last(true).seed(seed)),
      DataLoader(split.valid, DataLoaderOptions().batch_size(batch_size)));
}

namespace {

// Bounds memory on hostile input (a gzip bomb); Fashion-MNIST train is 47 MB.
constexpr size_t kMaxIdxBytes = size_t(1) << 32;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Inflates gzip data fed to it in chunks, so a file is never held whole: the
/// output is bounded by kMaxIdxBytes and the input only passes through. Reads
/// what gzip itself reads: several members one after another (`cat a.gz b.gz`),
/// and zero padding after the last (tape blocks; gzip ignores it too). zlib
/// checks each member's CRC and length, so a truncated or corrupted file is
/// reported rather than read short.
class Gunzip {
 public:
  explicit Gunzip(std::string name) : name_(std::move(name)) {
    std::memset(&zs_, 0, sizeof(zs_));
    TORCH_CHECK(inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, "zlib init failed");
  }
  ~Gunzip() { inflateEnd(&zs_); }
  Gunzip(const Gunzip&) = delete;
  Gunzip& operator=(const Gunzip&) = delete;

  void feed(const uint8_t* data, size_t size) {
    if (!started_) {
      TORCH_CHECK(size >= 2 && data[0] == 0x1f && data[1] == 0x8b, name_, " is not a gzip file");
      started_ = true;
    }
    while (size > 0) {
      if (padding_) {  // after a member: zeros, or the next member
        while (size > 0 && *data == 0) ++data, --size, ++zeros_;
        if (size == 0) return;
        TORCH_CHECK(zeros_ == 0 && *data == 0x1f, name_,
                    " has bytes after its gzip data that are neither zero padding nor another gzip member");
        TORCH_CHECK(inflateReset(&zs_) == Z_OK, "zlib reset failed");
        padding_ = false;
      }
      zs_.next_in = const_cast<uint8_t*>(data);  // zlib's API is not const-correct; it only reads
      zs_.avail_in = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
      const size_t offered = zs_.avail_in;
      while (zs_.avail_in > 0 && !padding_) {
        uint8_t chunk[1 << 16];
        zs_.next_out = chunk;
        zs_.avail_out = sizeof(chunk);
        const int rc = inflate(&zs_, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
          TORCH_CHECK(false, name_, " is corrupt (", zs_.msg ? zs_.msg : "unknown zlib error", ")");
        out_.insert(out_.end(), chunk, chunk + (sizeof(chunk) - zs_.avail_out));
        TORCH_CHECK(out_.size() <= kMaxIdxBytes, name_, " inflates to more than ", kMaxIdxBytes, " bytes; refusing to read it");
        if (rc == Z_STREAM_END) padding_ = true;
        else if (rc == Z_BUF_ERROR && zs_.avail_out != 0) break;  // needs more input
      }
      const size_t used = offered - zs_.avail_in;
      data += used;
      size -= used;
    }
  }

  std::vector<uint8_t> finish() {
    TORCH_CHECK(started_, name_, " is not a gzip file (it is empty)");
    TORCH_CHECK(padding_, name_, " is truncated (gzip stream ends early)");
    return std::move(out_);
  }

 private:
  std::string name_;
  z_stream zs_;
  std::vector<uint8_t> out_;
  bool started_ = false;
  bool padding_ = false;  // a member ended: what follows is zeros or another member
  size_t zeros_ = 0;
};

std::vector<uint8_t> gunzip(const uint8_t* data, size_t size, const std::string& name) {
  Gunzip g(name);
  g.feed(data, size);
  return g.finish();
}

} // namespace

torch::Tensor read_idx(const std::string& path, int expected_dims) {
  if (!ends_with(path, ".gz")) {
    const std::string raw = detail::read_whole_file(path, "", kMaxIdxBytes + 20);
    return parse_idx(reinterpret_cast<const uint8_t*>(raw.data()), raw.size(), false, path, expected_dims);
  }
  // Streamed: a .gz padded with a gigabyte of zeros costs a chunk of memory, not a gigabyte.
  Gunzip g(path);
  detail::read_file_chunks(path, "", [&](const char* chunk, size_t n) { g.feed(reinterpret_cast<const uint8_t*>(chunk), n); });
  const std::vector<uint8_t> inflated = g.finish();
  return parse_idx(inflated.data(), inflated.size(), false, path, expected_dims);
}

torch::Tensor parse_idx(const uint8_t* data, size_t size, bool gzipped, const std::string& name, int expected_dims) {
  std::vector<uint8_t> inflated;
  if (gzipped) {
    inflated = gunzip(data, size, name);
    data = inflated.data();
    size = inflated.size();
  }
  const c10::ArrayRef<uint8_t> bytes(data, size);
  TORCH_CHECK(bytes.size() >= 4, name, " is too short to be an idx file (", bytes.size(), " bytes)");
  TORCH_CHECK(bytes[0] == 0 && bytes[1] == 0, name, " has a bad idx magic number (first bytes must be 0)");
  TORCH_CHECK(bytes[2] == 0x08, name, " has idx data type 0x", std::hex, int(bytes[2]),
              " (only unsigned byte, 0x08, is supported)");
  const int ndims = bytes[3];
  TORCH_CHECK(ndims >= 1 && ndims <= 4, name, " has ", ndims, " dims (expected 1 to 4)");
  const auto magic = [](int dims) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", 0x800 + dims);
    return std::string(hex) + (dims == 1 ? ", as label files have" : dims == 3 ? ", as image files have" : "");
  };
  TORCH_CHECK(expected_dims == 0 || ndims == expected_dims, name, " has the idx magic of ", ndims, "-d data (",
              magic(ndims), ") but is read as ", expected_dims, "-d data (", magic(expected_dims), "): is it the other file of the pair?");
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  TORCH_CHECK(bytes.size() >= header, name, " is truncated inside its idx header");
  std::vector<int64_t> dims;
  uint64_t count = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* p = bytes.data() + 4 + 4 * d;
    const uint64_t dim = (uint64_t(p[0]) << 24) | (uint64_t(p[1]) << 16) | (uint64_t(p[2]) << 8) | p[3];
    count *= dim;  // <= 4 dims of < 2^32 each: bounded below by the size check that follows
    TORCH_CHECK(count <= (uint64_t(1) << 40), name, " declares an implausible size");
    dims.push_back(static_cast<int64_t>(dim));
  }
  const uint64_t payload = bytes.size() - header;
  TORCH_CHECK(payload >= count, name, " is truncated: header declares ", count, " values but only ",
              payload, " follow");
  TORCH_CHECK(payload == count, name, " has ", payload - count, " trailing bytes after its ", count, " values");
  torch::Tensor t = at::empty(dims, at::kByte);
  if (count) std::memcpy(t.data_ptr<uint8_t>(), data + header, count);
  return t;
}

DatasetSplit fashion_mnist(const std::string& dir) {
  // Each file as Debian ships it (.gz), or uncompressed when only that is there.
  auto file = [&](const std::string& name) {
    const std::string gz = dir + "/" + name + ".gz", raw = dir + "/" + name;
    std::ifstream probe(gz);
    return probe.good() || !std::ifstream(raw).good() ? gz : raw;
  };
  auto load = [&](const std::string& images_file, const std::string& labels_file) {
    const std::string ip = file(images_file), lp = file(labels_file);
    torch::Tensor images = read_idx(ip, 3), labels = read_idx(lp, 1);
    TORCH_CHECK(images.dim() == 3 && images.size(1) == 28 && images.size(2) == 28, ip,
                " does not hold 28x28 images (dims ", images.sizes(), ")");
    TORCH_CHECK(labels.dim() == 1, lp, " does not hold a 1-d label vector");
    TORCH_CHECK(images.size(0) == labels.size(0), ip, " has ", images.size(0), " images but ", lp, " has ",
                labels.size(0), " labels");
    TORCH_CHECK(labels.numel() == 0 || labels.max().item<int64_t>() < 10, lp, " has labels outside 0..9");
    torch::Tensor x = images.unsqueeze(1).to(at::kFloat).div_(255.).sub_(kFashionMnistMean).div_(kFashionMnistStd);
    return Dataset{x, labels.to(at::kLong)};
  };
  return {load("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          load("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")};
}

} // namespace mixtrain::data
