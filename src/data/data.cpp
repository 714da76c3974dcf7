#include "mixtrain/data/data.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <zlib.h>

#include "util/read_file.h"

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
  const torch::Tensor idx = order_.defined() ? order_.slice(0, start, stop) : torch::Tensor();
  const auto take = [&](const torch::Tensor& t) { return idx.defined() ? t.index_select(0, idx) : t.slice(0, start, stop); };
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

/// Inflates a gzip stream held in memory.
std::vector<uint8_t> gunzip(const uint8_t* data, size_t size, const std::string& name) {
  TORCH_CHECK(size >= 2 && data[0] == 0x1f && data[1] == 0x8b, name, " is not a gzip file");
  // zlib's inflate with gzip framing checks the CRC and length in the trailer,
  // so a truncated or corrupted file is reported rather than read short.
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  TORCH_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "zlib init failed");
  std::vector<uint8_t> out;
  uint8_t chunk[1 << 16];
  zs.next_in = const_cast<uint8_t*>(data);  // zlib's API is not const-correct; it only reads
  zs.avail_in = static_cast<uInt>(size);
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    zs.next_out = chunk;
    zs.avail_out = sizeof(chunk);
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      const bool truncated = rc == Z_BUF_ERROR && zs.avail_in == 0;
      const std::string msg = zs.msg ? zs.msg : "unknown zlib error";
      inflateEnd(&zs);
      TORCH_CHECK(!truncated, name, " is truncated (gzip stream ends early)");
      TORCH_CHECK(false, name, " is corrupt (", msg, ")");
    }
    out.insert(out.end(), chunk, chunk + (sizeof(chunk) - zs.avail_out));
    if (out.size() > kMaxIdxBytes) {
      inflateEnd(&zs);
      TORCH_CHECK(false, name, " inflates to more than ", kMaxIdxBytes, " bytes; refusing to read it");
    }
  }
  inflateEnd(&zs);
  return out;
}

} // namespace

torch::Tensor read_idx(const std::string& path) {
  const std::string raw = detail::read_whole_file(path);
  return parse_idx(reinterpret_cast<const uint8_t*>(raw.data()), raw.size(), ends_with(path, ".gz"), path);
}

torch::Tensor parse_idx(const uint8_t* data, size_t size, bool gzipped, const std::string& name) {
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
    torch::Tensor images = read_idx(ip), labels = read_idx(lp);
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
