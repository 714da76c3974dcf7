// Learner::save / load: exact resume (bitwise) in fp32, emulated fp16 with
// overflows and bf16 master weights, mid-epoch and at an epoch boundary;
// corrupt, truncated and mismatched checkpoints; atomic replacement.
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

namespace {

using namespace mixtrain;
namespace nn = torch::nn;

enum class Mode { kFp32, kFp16Emulated, kBf16Master };

/// Injected overflows at fixed global steps, so both runs see the same ones.
bool overflow_steps(int64_t step) { return step % 5 == 2; }

/// Small CNN with BatchNorm (buffers matter for resume) on image-like blobs.
Learner make_learner(Mode mode, uint64_t seed = 5) {
  torch::manual_seed(seed);
  auto make = [](int64_t n, uint64_t s) {
    auto gen = at::detail::createCPUGenerator(s);
    torch::Tensor y = torch::randint(3, {n}, gen, torch::kLong);
    torch::Tensor x = torch::randn({n, 1, 6, 6}, gen) + y.to(torch::kFloat).view({n, 1, 1, 1});
    return data::Dataset{x, y};
  };
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)), nn::BatchNorm2d(4), nn::ReLU(),
                       nn::Flatten(), nn::Linear(4 * 36, 3));
  Learner learn(model, data::DataLoaders::from_split({make(96, 1), make(32, 2)}, 16, 9), cross_entropy(),
                LearnerOptions().progress(false).metrics({accuracy()}));
  if (mode == Mode::kFp16Emulated) learn.to_fp16(amp::GradScalerOptions().init_scale(std::pow(2.0, 24)).growth_interval(3));
  if (mode == Mode::kBf16Master) learn.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16).max_noskip(4));
  return learn;
}

/// Saves at training step `at` (after that step) and stops the fit, like an interrupt.
class SaveAndStop : public Callback {
 public:
  SaveAndStop(int64_t at, std::string path) : at_(at), path_(std::move(path)) { order = 100; }
  void after_batch(Learner& learn) override {
    if (learn.training() && learn.train_iter() == at_) {
      learn.save(path_);
      throw CancelFitException();
    }
  }
 private:
  int64_t at_;
  std::string path_;
};

std::vector<torch::Tensor> state_of(Learner& learn) {
  std::vector<torch::Tensor> out;
  for (const auto& t : learn.model().state_tensors()) out.push_back(t.clone());
  return out;
}

class CheckpointTest : public test::SeededTest {};

TEST_F(CheckpointTest, ResumeIsBitwiseIdenticalInEveryPrecisionMode) {
  const std::string dir = test::scratch_dir("ckpt_resume");
  for (Mode mode : {Mode::kFp32, Mode::kFp16Emulated, Mode::kBf16Master}) {
    // 6 steps per epoch, 3 epochs: stop mid-epoch (step 8) and at an epoch boundary (step 12).
    for (int64_t stop_at : {8, 12}) {
      SCOPED_TRACE("mode " + std::to_string(int(mode)) + ", stop after step " + std::to_string(stop_at));
      Learner full = make_learner(mode);
      if (mode != Mode::kFp32) full.add_cb(std::make_shared<test::InjectOverflow>(overflow_steps));
      full.fit_one_cycle(3, 1e-2);
      const auto expected = state_of(full);

      const std::string path = dir + "/ckpt.pt";
      Learner first = make_learner(mode);
      if (mode != Mode::kFp32) first.add_cb(std::make_shared<test::InjectOverflow>(overflow_steps));
      first.fit_one_cycle(3, 1e-2, {}, {std::make_shared<SaveAndStop>(stop_at, path)});
      EXPECT_EQ(first.recorder().steps().size(), static_cast<size_t>(stop_at));

      Learner resumed = make_learner(mode, /*seed=*/999);  // other initial weights: all must come from the file
      if (mode != Mode::kFp32) resumed.add_cb(std::make_shared<test::InjectOverflow>(overflow_steps));
      resumed.load(path);
      resumed.fit_one_cycle(3, 1e-2);
      test::expect_bitwise_equal(state_of(resumed), expected);
      EXPECT_EQ(resumed.recorder().steps().size(), full.recorder().steps().size());
      EXPECT_EQ(resumed.recorder().values().size(), 3u);
      EXPECT_EQ(resumed.recorder().values().back().train_loss, full.recorder().values().back().train_loss);
      EXPECT_EQ(resumed.recorder().values().back().metrics, full.recorder().values().back().metrics);
      if (mode == Mode::kFp16Emulated) {
        EXPECT_EQ(resumed.precision_cb()->loss_scale(), full.precision_cb()->loss_scale());
        EXPECT_EQ(test::recorded_scales(resumed), test::recorded_scales(full));
        EXPECT_GT(full.recorder().skipped_steps(), 0);
      }
      if (mode == Mode::kBf16Master) {
        auto a = resumed.get_cb<amp::MasterWeights>(), b = full.get_cb<amp::MasterWeights>();
        test::expect_bitwise_equal(a->masters(), b->masters());  // fp32 masters, no precision lost
        EXPECT_EQ(a->loss_scale(), b->loss_scale());
      }
    }
  }
}

TEST_F(CheckpointTest, TruncatedOrCorruptCheckpointsAreClearErrors) {
  const std::string dir = test::scratch_dir("ckpt_corrupt");
  Learner learn = make_learner(Mode::kFp32);
  learn.fit(1, 1e-2);
  learn.save(dir + "/good.pt");
  const auto bytes = test::read_raw(dir + "/good.pt");
  const auto before = state_of(learn);
  // Every offset inside the header, then a sample of offsets across the body.
  std::vector<size_t> cuts;
  for (size_t cut = 1; cut <= 40; ++cut) cuts.push_back(cut);
  for (size_t cut = 41; cut < bytes.size(); cut += bytes.size() / 97) cuts.push_back(cut);
  cuts.push_back(bytes.size() - 1);
  for (size_t cut : cuts) {
    test::write_raw(dir + "/cut.pt", std::vector<uint8_t>(bytes.begin(), bytes.begin() + cut));
    SCOPED_TRACE("cut at " + std::to_string(cut));
    EXPECT_THROW_WITH(learn.load(dir + "/cut.pt"), "is truncated");
  }
  test::write_raw(dir + "/empty.pt", {});
  EXPECT_THROW_WITH(learn.load(dir + "/empty.pt"), "is empty");
  for (size_t at : {size_t(30), bytes.size() / 2, bytes.size() - 1}) {
    auto flipped = bytes;
    flipped[at] ^= 0x04;  // one bit rots
    test::write_raw(dir + "/flipped.pt", flipped);
    SCOPED_TRACE("flip at " + std::to_string(at));
    EXPECT_THROW_WITH(learn.load(dir + "/flipped.pt"), "checksum mismatch");
  }
  auto longer = bytes;
  longer.push_back(0);
  test::write_raw(dir + "/longer.pt", longer);
  EXPECT_THROW_WITH(learn.load(dir + "/longer.pt"), "unexpected bytes after the archive");
  test::write_raw(dir + "/other.pt", {'P', 'K', 3, 4, 0, 0});
  EXPECT_THROW_WITH(learn.load(dir + "/other.pt"), "does not start with the mixtrain checkpoint header");
  EXPECT_THROW_WITH(learn.load(dir + "/missing.pt"), "Cannot open checkpoint");
  test::expect_bitwise_equal(state_of(learn), before);  // failed loads changed nothing
}

// A checkpoint whose tensor claims more than the storage the file holds for it
// (as an edited pickle would): refused before anything reads it, and a failed
// load changes nothing.
TEST_F(CheckpointTest, ATensorReachingPastItsStorageIsRefused) {
  Learner learn = make_learner(Mode::kFp32);
  learn.fit(1, 1e-2);
  const auto before = state_of(learn);
  torch::Tensor weight = learn.model().module().parameters().front();
  const std::vector<int64_t> sizes = weight.sizes().vec();
  std::vector<int64_t> claimed = sizes;
  claimed[0] *= 3;
  std::string bytes;
  {
    torch::NoGradGuard no_grad;
    weight.unsafeGetTensorImpl()->set_sizes_contiguous(claimed);  // the same storage, three times the rows
    bytes = learn.save_to_memory();
    weight.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  }
  EXPECT_THROW_WITH(learn.load_from_memory(bytes.data(), bytes.size(), "edited.pt"),
                    "bytes of data but the file holds");
  test::expect_bitwise_equal(state_of(learn), before);
}

TEST_F(CheckpointTest, OnlyRegularFilesAreReadAsCheckpoints) {
  const std::string dir = test::scratch_dir("ckpt_special");
  Learner learn = make_learner(Mode::kFp32);
  std::filesystem::create_symlink("/dev/zero", dir + "/zero.pt");
  EXPECT_THROW_WITH(learn.load(dir + "/zero.pt"), "not a regular file (a device or socket)");  // not 17 GB and bad_alloc
  ASSERT_EQ(::mkfifo((dir + "/fifo.pt").c_str(), 0600), 0);
  EXPECT_THROW_WITH(learn.load(dir + "/fifo.pt"), "not a regular file (a pipe)");  // not blocked forever
}

// The newest complete checkpoint, whatever `latest` says; a killed writer's temp file is none.
TEST_F(CheckpointTest, TheNewestCompleteCheckpointIsFoundWithoutLatest) {
  const std::string dir = test::scratch_dir("ckpt_newest");
  EXPECT_FALSE(callbacks::Checkpointer::holds_checkpoints(dir));
  test::write_raw(dir + "/checkpoint-16.pt.tmp.999999999", {1, 2, 3});
  test::write_raw(dir + "/latest", {'c', 'h', 'e', 'c', 'k', '\n'});
  EXPECT_FALSE(callbacks::Checkpointer::holds_checkpoints(dir)) << "a temp file or a bare latest is no checkpoint";
  EXPECT_EQ(callbacks::Checkpointer::latest(dir), "");
  EXPECT_EQ(callbacks::Checkpointer::remove_dead_temp_files(dir), 1);
  EXPECT_FALSE(std::filesystem::exists(dir + "/checkpoint-16.pt.tmp.999999999"));
  // A live writer's temp file (this process's) stays.
  test::write_raw(dir + "/checkpoint-20.pt.tmp." + std::to_string(::getpid()), {1});
  EXPECT_EQ(callbacks::Checkpointer::remove_dead_temp_files(dir), 0);
  Learner learn = make_learner(Mode::kFp32);
  learn.save(dir + "/checkpoint-8.pt");
  learn.save(dir + "/checkpoint-16.pt");
  test::write_raw(dir + "/latest", {'c', 'h', 'e', 'c', 'k', 'p', 'o', 'i', 'n', 't', '-', '8', '.', 'p', 't', '\n'});
  EXPECT_TRUE(callbacks::Checkpointer::holds_checkpoints(dir));
  EXPECT_EQ(callbacks::Checkpointer::latest(dir), dir + "/checkpoint-16.pt");
}

// Inputs the fuzzer (fuzz/checkpoint_fuzz.cpp) once crashed on stay rejected cleanly.
TEST_F(CheckpointTest, FuzzRegressionInputsAreClearErrors) {
  Learner learn = make_learner(Mode::kFp16Emulated);
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(MIXTRAIN_SOURCE_DIR "/fuzz/regressions/checkpoint")) {
    SCOPED_TRACE(entry.path().string());
    const auto bytes = test::read_raw(entry.path().string());
    EXPECT_THROW_WITH(learn.load_from_memory(reinterpret_cast<const char*>(bytes.data()), bytes.size(), "regression"),
                      "heckpoint regression");
    ++seen;
  }
  EXPECT_GE(seen, 1);
}

TEST_F(CheckpointTest, WrongModelOrPrecisionIsNamed) {
  const std::string dir = test::scratch_dir("ckpt_mismatch");
  Learner learn = make_learner(Mode::kFp32);
  learn.fit(1, 1e-2);
  learn.save(dir + "/fp32.pt");

  Learner other(nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 8, 3).padding(1)), nn::BatchNorm2d(8), nn::ReLU(),
                               nn::Flatten(), nn::Linear(8 * 36, 3)),
                learn.dls(), cross_entropy(), LearnerOptions().progress(false).metrics({accuracy()}));
  EXPECT_THROW_WITH(other.load(dir + "/fp32.pt"), "'0.weight' has shape [4, 1, 3, 3] in the checkpoint but [8, 1, 3, 3]");

  Learner master = make_learner(Mode::kBf16Master);
  EXPECT_THROW_WITH(master.load(dir + "/fp32.pt"), "saved in precision mode 'fp32' but this learner uses 'master_weights:BFloat16'");

  Learner fewer_metrics(learn.model(), learn.dls(), cross_entropy(), LearnerOptions().progress(false));
  EXPECT_THROW_WITH(fewer_metrics.load(dir + "/fp32.pt"), "saved with 1 metrics");

  Learner resumed = make_learner(Mode::kFp32);
  resumed.load(dir + "/fp32.pt");
  EXPECT_THROW_WITH(resumed.fit(2, 1e-2), "resume it with the same number of epochs");
}

/// A stateful callback that refuses every saved state, as DataParallel refuses
/// a checkpoint from another world size.
struct Picky : Callback {
  std::string state_key() const override { return "picky"; }
  void save_state(torch::serialize::OutputArchive& ar) const override { ar.write("version", torch::tensor(1)); }
  void check_state(torch::serialize::InputArchive&) const override { TORCH_CHECK(false, "picky refuses"); }
};

TEST_F(CheckpointTest, CallbackStateMismatchIsNamedAndLeavesTheLearnerAsItWas) {
  const std::string dir = test::scratch_dir("ckpt_callbacks");
  Learner learn = make_learner(Mode::kFp32);
  learn.fit(1, 1e-2);
  learn.save(dir + "/plain.pt");
  learn.add_cb(std::make_shared<Picky>());
  learn.save(dir + "/picky.pt");

  Learner fresh = make_learner(Mode::kFp32, 77);
  const auto before = state_of(fresh);
  EXPECT_THROW_WITH(fresh.load(dir + "/picky.pt"), "callbacks: it holds state for callback 'picky', which this learner does not have");
  fresh.add_cb(std::make_shared<Picky>());
  EXPECT_THROW_WITH(fresh.load(dir + "/plain.pt"), "callbacks: it holds no state for this learner's callback 'picky'");
  EXPECT_THROW_WITH(fresh.load(dir + "/picky.pt"), "picky state: picky refuses");
  test::expect_bitwise_equal(state_of(fresh), before);  // refused before the model was touched
}

/// Everything a checkpoint holds of `learn`, as bytes: equal bytes mean a bitwise
/// equal Learner (model, optimizer state, every callback's state, position, RNG).
std::string checkpoint_bytes(Learner& learn, const std::string& path) {
  learn.save(path);
  const auto bytes = test::read_raw(path);
  return std::string(bytes.begin(), bytes.end());
}

/// A refused load must change nothing, even when the refusal comes only after the
/// model's tensors were copied (the Recorder's metric count, the masters' layout,
/// the optimizer's state are checked as they load). The loading Learner has its
/// own model, so a half-applied load would show.
TEST_F(CheckpointTest, ARefusedLoadLeavesTheLearnerBitwiseUnchanged) {
  const std::string dir = test::scratch_dir("ckpt_all_or_nothing");
  struct Case {
    const char* name;
    std::function<void(Learner&)> prepare_saver;
    std::function<Learner()> make_loader;
    const char* error;
  };
  // The loader's model is its own (seed 77), never the saver's.
  const std::vector<Case> cases = {
      {"metric count", [](Learner&) {},
       [] {
         Learner l = make_learner(Mode::kFp32, 77);
         return Learner(l.model(), l.dls(), cross_entropy(),
                        LearnerOptions().progress(false).metrics({accuracy(), error_rate()}));
       },
       "saved with 1 metrics"},
      {"master layout", [](Learner& l) { l.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16)); },
       [] {
         Learner l = make_learner(Mode::kFp32, 77);
         l.to_half(amp::MasterWeightsOptions().dtype(torch::kBFloat16).flat_master(true));
         return l;
       },
       "master tensors"},
      {"optimizer", [](Learner&) {},
       [] {
         Learner l = make_learner(Mode::kFp32, 77);
         return Learner(l.model(), l.dls(), cross_entropy(),
                        LearnerOptions().progress(false).metrics({accuracy()}).opt_func(mixtrain::sgd(0.9)));
       },
       "optimizer state"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Learner saver = make_learner(Mode::kFp32, 5);
    c.prepare_saver(saver);
    saver.fit(1, 1e-2);
    saver.save(dir + "/saved.pt");

    Learner loader = c.make_loader();
    loader.fit(1, 3e-3);  // optimizer state, a Recorder history, masters: all must survive the refusal
    const std::string before = checkpoint_bytes(loader, dir + "/before.pt");
    const auto model_before = state_of(loader);
    EXPECT_THROW_WITH(loader.load(dir + "/saved.pt"), c.error);
    test::expect_bitwise_equal(state_of(loader), model_before);
    EXPECT_TRUE(checkpoint_bytes(loader, dir + "/after.pt") == before) << "the refused load changed the Learner";
  }
}

// A real writer, killed (SIGKILL) while it writes a large checkpoint over an older
// one: the older file is never opened for writing, so it still loads, bitwise.
TEST_F(CheckpointTest, AWriterKilledMidSaveLeavesThePreviousCheckpointLoadable) {
  const std::string dir = test::scratch_dir("ckpt_killed");
  const std::string path = dir + "/ckpt.pt";
  auto big = [] {
    torch::manual_seed(21);
    return Learner(nn::Linear(4096, 4096), data::DataLoaders::from_split({test::blobs(32, 3, 4096), test::blobs(16, 3, 4096)}, 16, 1),
                   cross_entropy(), LearnerOptions().progress(false).opt_func(sgd(0.0)));
  };
  Learner learn = big();  // 64 MB of weights
  learn.save(path);
  const auto saved = state_of(learn);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : learn.model().module().parameters()) p.add_(1.0);  // what the killed save would have written
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    learn.save(path);
    ::_exit(0);
  }
  // Kill it as soon as its temp file exists: mid-write (or mid-fsync), before the rename.
  const std::string tmp = path + ".tmp." + std::to_string(child);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(tmp) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer finished before it could be killed";
  EXPECT_TRUE(std::filesystem::exists(tmp)) << "killed before the rename: its temp file is left behind";
  Learner reader = big();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : reader.model().module().parameters()) p.zero_();
  }
  reader.load(path);
  test::expect_bitwise_equal(state_of(reader), saved);
}

TEST_F(CheckpointTest, SaveReplacesAtomicallyAndAnInterruptedSaveLeavesThePreviousFile) {
  const std::string dir = test::scratch_dir("ckpt_atomic");
  Learner learn = make_learner(Mode::kFp32);
  learn.fit(1, 1e-2);
  learn.save(dir + "/ckpt.pt");
  const auto first = test::read_raw(dir + "/ckpt.pt");
  Learner reader = make_learner(Mode::kFp32, 77);
  reader.load(dir + "/ckpt.pt");
  test::expect_bitwise_equal(state_of(reader), state_of(learn));
  // A real save replaces the file whole, and leaves no temp file of its own.
  learn.fit(1, 1e-2);
  learn.save(dir + "/ckpt.pt");
  EXPECT_NE(test::read_raw(dir + "/ckpt.pt"), first);
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt.pt.tmp." + std::to_string(::getpid())));
  learn.save(dir + "/new/folders/ckpt.pt");  // missing folders are made
  Learner again = make_learner(Mode::kFp32, 78);
  again.load(dir + "/new/folders/ckpt.pt");
  test::expect_bitwise_equal(state_of(again), state_of(learn));
  EXPECT_THROW_WITH(learn.save(dir + "/ckpt.pt/inside_a_file.pt"), "cannot create its folder " + dir + "/ckpt.pt");
}

} // namespace
