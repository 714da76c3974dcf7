#pragma once
/// In-memory datasets and loaders, the idx(.gz) reader and Fashion-MNIST.

#include <ATen/core/Generator.h>
#include <torch/types.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain::data {

/// Where Debian's `dataset-fashion-mnist` package puts the files.
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
/// Fashion-MNIST pixel statistics (after scaling to [0, 1]), as fastai uses them.
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

/// Inputs and targets, indexed along dim 0.
struct Dataset {
  torch::Tensor x;  ///< the model's (first) input
  torch::Tensor y;
  /// The model's further inputs (a mask, positions), in the order its forward
  /// takes them after x; each indexed along dim 0 like x.
  std::vector<torch::Tensor> extra_x = {};
  int64_t size() const { return x.defined() ? x.size(0) : 0; }
  /// The first `n` samples (all of them when n >= size()).
  Dataset head(int64_t n) const;
};

/// A training and a validation set.
struct DatasetSplit {
  Dataset train;
  Dataset valid;
};

/// One mini-batch.
struct Batch {
  torch::Tensor x;
  torch::Tensor y;
  std::vector<torch::Tensor> extra_x = {};  ///< further inputs, as Dataset::extra_x
  int64_t size() const { return x.size(0); }
  /// x, then extra_x: the arguments of the model's forward.
  std::vector<torch::Tensor> inputs() const;
  /// The batch on `device` (no copy when it is there already).
  Batch to(torch::Device device) const;
  /// The first `n` samples of `ds` as one batch (all of them when it has fewer).
  static Batch head_of(const Dataset& ds, int64_t n);
};

struct DataLoaderOptions {
  /// Samples per batch.
  TORCH_ARG(int64_t, batch_size) = 64;
  /// Reshuffle every epoch from the loader's own seeded generator.
  TORCH_ARG(bool, shuffle) = false;
  /// Drop the last incomplete batch (fastai does for training).
  TORCH_ARG(bool, drop_last) = false;
  /// Seed of the shuffling generator.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Data parallelism: the loader is one of `num_shards`. Every shard draws the
  /// same seeded permutation; a global batch is batch_size * num_shards samples
  /// and this shard takes its `shard`-th slice of each, so the shards together
  /// see what one loader with the global batch size would.
  TORCH_ARG(int64_t, num_shards) = 1;
  TORCH_ARG(int64_t, shard) = 0;
};

/// Batches over an in-memory Dataset. Each `begin()` starts a new epoch and,
/// when shuffling, draws a new permutation from the loader's generator, so the
/// sequence of epochs is reproducible from the seed alone.
class DataLoader {
 public:
  DataLoader() = default;
  DataLoader(Dataset dataset, DataLoaderOptions options);

  class Iterator {
   public:
    Iterator(const DataLoader* loader, int64_t index, torch::Tensor order)
        : loader_(loader), index_(index), order_(std::move(order)) {}
    Batch operator*() const;
    Iterator& operator++() { ++index_; return *this; }
    bool operator!=(const Iterator& other) const { return index_ != other.index_; }
   private:
    const DataLoader* loader_;
    int64_t index_;
    torch::Tensor order_;  // permutation for this epoch (undefined: sequential)
  };

  Iterator begin();
  Iterator end() const { return Iterator(this, num_batches(), {}); }

  /// Batches per epoch.
  int64_t num_batches() const;
  const Dataset& dataset() const { return dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  /// Makes this loader shard `shard` of `num_shards` (see DataLoaderOptions).
  void set_sharding(int64_t num_shards, int64_t shard);
  /// The shuffling generator (its state is what a checkpoint needs).
  at::Generator& generator() { return generator_; }

 private:
  Dataset dataset_;
  DataLoaderOptions options_;
  at::Generator generator_;
};

/// Training loader (shuffled, drop_last, as fastai) and validation loader.
struct DataLoaders {
  DataLoader train;
  DataLoader valid;
  DataLoaders() = default;
  DataLoaders(DataLoader train, DataLoader valid)
      : train(std::move(train)), valid(std::move(valid)) {}
  /// fastai's defaults: train shuffled with drop_last, valid in order.
  static DataLoaders from_split(const DatasetSplit& split, int64_t batch_size, uint64_t seed);
};

/// Reads an idx file (raw, or gzip-compressed when the name ends in ".gz").
/// Only unsigned-byte data (type 0x08) is supported, as in (Fashion-)MNIST.
/// Throws c10::Error naming the file and the problem: missing file, not gzip,
/// truncated data, bad magic, bad dims, size mismatch, trailing bytes. A .gz may
/// hold several gzip members and zero padding, as gzip reads it.
/// `expected_dims` (1 to 4; 0: any) is what the caller reads the file as: a file
/// whose magic says otherwise (an image file with a label file's magic) is named
/// as such before its sizes are compared.
torch::Tensor read_idx(const std::string& path, int expected_dims = 0);
/// The same from bytes in memory; `name` stands for the file in messages.
torch::Tensor parse_idx(const uint8_t* data, size_t size, bool gzipped, const std::string& name, int expected_dims = 0);

/// Loads Fashion-MNIST from `dir` (train: 60000, valid: the 10000 test images),
/// as float images [N,1,28,28] normalized with kFashionMnistMean/Std and int64 labels.
/// Reads each of the four files as `NAME.gz` or, when only that exists, uncompressed `NAME`.
DatasetSplit fashion_mnist(const std::string& dir = kFashionMnistDir);

/// Share of the training data a tensor file without validation data keeps aside for validation.
constexpr double kTensorFileValidFraction = 0.2;

/// Reads a dict saved by Python's torch.save: "x" (a tensor, or a list/tuple of
/// tensors for a model with several inputs), "y", and optionally "valid_x",
/// "valid_y". Without validation data, a seeded random kTensorFileValidFraction
/// of the samples (permutation drawn from `seed`) becomes the validation set.
/// float64 inputs are read as float32 (the models' dtype). Throws c10::Error
/// with one line naming the problem: not a torch.save file, a missing key, a
/// value that is not a tensor, x and y of different lengths, inputs and valid
/// inputs that differ in number, a tensor that claims more data than the file
/// holds for it.
DatasetSplit load_tensor_file(const std::string& path, uint64_t seed = 42);

/// load_tensor_file on a file's bytes already in memory; errors name `name`.
DatasetSplit parse_tensor_file(const std::string& bytes, const std::string& name, uint64_t seed = 42);

/// The split load_tensor_file makes, from tensors in memory (the Python front
/// door): `x` holds one tensor per model input; empty `valid_x` means the seeded
/// split. The same checks and conversions (float64 and half/bf16 read as fp32);
/// errors name `source` where load_tensor_file names the file, and data too small to
/// keep a share for validation is told `valid_hint` (in the front end's words).
DatasetSplit tensor_split(const std::vector<torch::Tensor>& x, const torch::Tensor& y,
                          const std::vector<torch::Tensor>& valid_x, const torch::Tensor& valid_y, uint64_t seed = 42,
                          const std::string& source = "data",
                          const std::string& valid_hint = "give more samples, or validation data of its own");

/// Where Debian's `fortunes` package puts its text files: the built-in
/// transformer's corpus (2.6 MB of English quotations, poems and definitions).
constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

/// A character-level language-modelling split from the text files in `dir`
/// (every regular file except fortune's .dat/.u8 indexes, in name order,
/// concatenated) or from one text file: bytes are tokens (vocabulary 256);
/// each sample is `context` tokens (x) and the same shifted by one (y), cut
/// without overlap. The last `valid_fraction` of the text is validation, so
/// no validation text is seen in training.
DatasetSplit text_corpus(const std::string& path = kFortunesDir, int64_t context = 64,
                         double valid_fraction = 0.1);

/// Perplexity of the unigram model fitted on `train`'s targets, measured on
/// `valid`'s: the baseline a language model has to beat.
double unigram_perplexity(const DatasetSplit& split);

} // namespace mixtrain::data
