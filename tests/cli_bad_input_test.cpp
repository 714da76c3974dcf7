// What a hostile tester (and an unlucky user) hands the CLI: a data file whose
// tensor claims more than its storage, a forward that never returns, an
// args.json edited to another run, data that does not fit the model, numbers
// past fp32's range, a run killed mid-write, an error deep inside a model, NaN
// inputs, a full disk, CLI11's own wording. Each is one clear line and a
// non-zero exit (or a warning), checked before the run folder exists where the
// README says so.
#include "cli_util.h"
#include "test_util.h"

#include <mixtrain/mixtrain.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>

namespace {

using namespace mixtrain;
using test::run_cli;
namespace fs = std::filesystem;

std::string bad_input_file(const std::string& name) { return test::exported_by("export_bad_input.py") + "/" + name; }

/// Flags that train the exported MLP on `data` quickly.
std::string mlp_on(const std::string& data, const std::string& model = "mlp.pt", int bs = 32) {
  return " --model " + bad_input_file(model) + " --data " + bad_input_file(data) + " --bs " + std::to_string(bs) + " --threads 1";
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

TEST(CliBadInputTest, ATensorClaimingMoreRowsThanItsStorageIsRefusedNotRead) {
  // The hostile tester's files (fuzz/make_tensor_file_seeds.py wrote them): x claims 300 or
  // 2,000,000 rows over a storage of 100.
  for (const char* data : {"rows-past-storage.pt", "rows-far-past-storage.pt"}) {
    SCOPED_TRACE(data);
    const std::string out = test::scratch_dir("bad_storage") + "/run";
    const auto r = run_cli("train --model " + bad_input_file("mlp.pt") + " --data " MIXTRAIN_SOURCE_DIR "/fuzz/regressions/tensor_file/" +
                           data + " --bs 32 --threads 1 --epochs 1 --out " + out);
    EXPECT_EQ(r.code, 2) << r.err;  // not 139
    EXPECT_TRUE(contains(r.err, "is damaged: a tensor of shape [")) << r.err;  // torch 2.x refuses it while unpickling
    EXPECT_TRUE(contains(r.err, "bytes of data but the file holds 2800 for it")) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

TEST(CliBadInputTest, OneSigtermBeforeTheFirstStepEndsTheRunAtOnce) {
  // The forward hangs for a real batch: a supervisor's single SIGTERM must end it.
  const std::string out = test::scratch_dir("sigterm_hang") + "/run";
  const auto start = std::chrono::steady_clock::now();
  // Without the fix the run ignores the TERM; -k 30 then kills it (137).
  const auto r = run_cli("train" + mlp_on("data.pt", "hang.pt") + " --epochs 1 --out " + out,
                         "timeout --preserve-status -k 30 3 ");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_LT(seconds, 25) << "the SIGTERM was not obeyed";
}

TEST(CliBadInputTest, AResumeRefusesAnArgsJsonEditedToAnotherRun) {
  const std::string out = test::scratch_dir("resume_edited") + "/run";
  const auto cut = run_cli("train" + mlp_on("data.pt") + " --epochs 2 --out " + out + " --interrupt-at-step 5");
  ASSERT_EQ(cut.code, 130) << cut.err;
  const std::string original = test::slurp(out + "/args.json");
  for (const auto& [from, to, field] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"bs\": 32", "\"bs\": 16", "--bs 16"}, {"\"limit\": -1", "\"limit\": 100", "--limit 100"},
           {"\"lr\": 0.003", "\"lr\": 0.01", "--lr 0.01"},
           // A switch is on or off (not "drop --wd-bn-bias"); an empty list is none (not "--keep-fp32 ").
           {"\"wd_bn_bias\": false", "\"wd_bn_bias\": true", "--wd-bn-bias on but its checkpoints were trained with --wd-bn-bias off"},
           {"\"keep_fp32\": \\[\\]", "\"keep_fp32\": [\"fc\"]", "--keep-fp32 fc but its checkpoints were trained with --keep-fp32 none"}}) {
    SCOPED_TRACE(field);
    const std::string edited = std::regex_replace(original, std::regex(from), to);
    ASSERT_NE(edited, original) << original;
    std::ofstream(out + "/args.json") << edited;
    const auto r = run_cli("train --resume " + out);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "args.json sets " + field + (contains(field, " but ") ? "" : " but its checkpoints were trained with")))
        << r.err;
  }
  std::ofstream(out + "/args.json") << original;
  const auto resumed = run_cli("train --resume " + out + " --threads 1");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
}

TEST(CliBadInputTest, TargetsAndValidationDataAreCheckedBeforeTheRunFolderExists) {
  for (const auto& [data, message] : std::vector<std::pair<std::string, std::string>>{
           {"y_class_10.pt", "the training targets hold the class 10, but the model's output has 10 classes"},
           {"y_class_minus_1.pt", "the training targets hold the class -1"},
           {"valid_y_99.pt", "the validation targets hold the class 99"},
           {"valid_x_3_channels.pt", "the model does not run on the validation data"},
           // Every loss the mean of nothing: NaN at step 0, which the NaN stop blamed on the data's values.
           {"y_all_ignored.pt", "every training target is -100, cross_entropy's ignore index"}}) {
    SCOPED_TRACE(data);
    const std::string out = test::scratch_dir("bad_targets") + "/run";
    for (const char* command : {"train", "doctor", "lr_find"}) {
      const auto r = run_cli(std::string(command) + mlp_on(data) + " --out " + out);
      EXPECT_EQ(r.code, 2) << command << ": " << r.err;
      EXPECT_TRUE(contains(r.err, message)) << command << ": " << r.err;
      EXPECT_FALSE(fs::exists(out)) << command;
    }
  }
}

TEST(CliBadInputTest, NonFiniteInputsAreWarnedAboutBeforeTraining) {
  const std::string out = test::scratch_dir("nan_valid") + "/run";
  const auto r = run_cli("train" + mlp_on("valid_x_nan.pt") + " --epochs 1 --out " + out);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "mixtrain: warning: the validation inputs hold 1 NaN/inf value (of 700)")) << r.err;
}

TEST(CliBadInputTest, NaNInputsAtStepZeroAreSaidToBeTheInputs) {
  const std::string out = test::scratch_dir("nan_inputs") + "/run";
  const auto r = run_cli("train" + mlp_on("x_nan.pt", "normed.pt") + " --epochs 1 --out " + out);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "at step 0: this batch's inputs hold NaN/inf")) << r.err;
  EXPECT_TRUE(contains(r.err, "the parameters are finite; the buffers bn.running_mean, bn.running_var are not")) << r.err;
  EXPECT_FALSE(contains(r.err, "the weights are already non-finite")) << r.err;
}

TEST(CliBadInputTest, EveryNumberMustBeFiniteAndWithinFp32Range) {
  const std::string out = test::scratch_dir("numbers") + "/run";
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {" --precision fp16 --growth-factor inf --growth-interval 1", "invalid --growth-factor inf: must be a finite number"},
           {" --lr 1e300", "invalid --lr 1e+300: must be at most 3.4e38"},
           {" --precision fp16 --init-scale 1e39", "invalid --init-scale 1e+39: must be at most 3.4e38"},
           {" --clip 1e39", "invalid --clip 1e+39: must be at most 3.4e38"},
           // A mode that ignores a number still stores it: NaN became null in args.json, and no resume could read it.
           {" --precision bf16-pure --init-scale nan", "invalid --init-scale nan: must be a finite number"},
           {" --precision bf16-pure --growth-factor inf", "invalid --growth-factor inf: must be a finite number"},
           // 2^63 wrapped to seed 0 (and a negative seed in summary.json).
           {" --seed 9223372036854775808", "invalid --seed 9223372036854775808: must be at most 2^63-1"},
           {" --seed 18446744073709551616", "invalid --seed 18446744073709551616: must be at most 2^63-1"}}) {
    SCOPED_TRACE(flags);
    const auto r = run_cli("train" + mlp_on("data.pt") + flags + " --out " + out);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, message)) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

TEST(CliBadInputTest, AKilledWritersTempFileIsNoCheckpointAndIsRemoved) {
  const std::string out = test::scratch_dir("temp_only") + "/run";
  const auto cut = run_cli("train" + mlp_on("data.pt") + " --epochs 2 --out " + out + " --interrupt-at-step 5");
  ASSERT_EQ(cut.code, 130) << cut.err;
  // As if killed during the first checkpoint write: only the temp file of a dead writer.
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) fs::remove(e.path());
  fs::remove(out + "/latest");
  const std::string temp = out + "/checkpoint-5.pt.tmp.999999999";
  std::ofstream(temp) << "half a checkpoint";
  const auto resume = run_cli("train --resume " + out);
  EXPECT_EQ(resume.code, 2);
  EXPECT_TRUE(contains(resume.err, "holds no complete checkpoint")) << resume.err;
  EXPECT_FALSE(fs::exists(temp)) << "a dead writer's temp file stays";
  // Not a loop: without --resume the run starts again, no --force needed.
  const auto again = run_cli("train" + mlp_on("data.pt") + " --epochs 1 --out " + out);
  EXPECT_EQ(again.code, 0) << again.err;
}

TEST(CliBadInputTest, AResumeTakesTheNewestCompleteCheckpointWhateverLatestSays) {
  const std::string out = test::scratch_dir("stale_latest") + "/run";
  const auto cut = run_cli("train" + mlp_on("data.pt") + " --epochs 3 --save-every 1 --out " + out + " --interrupt-at-step 20");
  ASSERT_EQ(cut.code, 130) << cut.err;
  ASSERT_TRUE(fs::exists(out + "/checkpoint-15.pt") && fs::exists(out + "/checkpoint-20.pt"));
  // Killed while `latest` was being replaced: it still names the older one. Or edited to point elsewhere.
  int copy = 0;
  for (const std::string latest : {"checkpoint-15.pt", "../../../../etc/passwd"}) {
    SCOPED_TRACE(latest);
    const std::string run = out + "-" + std::to_string(copy++);
    fs::copy(out, run, fs::copy_options::recursive);
    std::ofstream(run + "/latest") << latest << "\n";
    const auto r = run_cli("train --resume " + run);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(contains(r.out, "resuming " + run + " from " + run + "/checkpoint-20.pt")) << r.out;
  }
  // A junk file with the highest step: the older complete checkpoint is named.
  const std::string junk = out + "-junk";
  fs::copy(out, junk, fs::copy_options::recursive);
  std::ofstream(junk + "/checkpoint-99.pt") << "not a checkpoint";
  auto r = run_cli("train --resume " + junk);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "the older checkpoint " + junk + "/checkpoint-20.pt may be whole: move the damaged one away"))
      << r.err;
  // A `latest` that is a directory: said at once, not when the first checkpoint is written an epoch later.
  const std::string dir_latest = out + "-dir-latest";
  fs::copy(out, dir_latest, fs::copy_options::recursive);
  fs::remove(dir_latest + "/latest");
  fs::create_directories(dir_latest + "/latest/x");
  r = run_cli("train --resume " + dir_latest);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "holds 'latest', which is not a regular file")) << r.err;
  EXPECT_FALSE(contains(r.out, "resuming")) << r.out;
}

TEST(CliBadInputTest, AnErrorInsideTheModelKeepsItsCauseAndPlace) {
  const std::string out = test::scratch_dir("model_error") + "/run";
  // A `raise` in the model, for batches larger than the 2-sample probe: the line says the message and the source line.
  const auto boom = run_cli("train" + mlp_on("data.pt", "boom.pt") + " --epochs 1 --out " + out);
  EXPECT_EQ(boom.code, 2);
  EXPECT_TRUE(std::regex_search(boom.err, std::regex("mixtrain: error: the model's forward failed at .*export_bad_input.py:[0-9]+: boom in forward\n")))
      << boom.err;
  EXPECT_FALSE(contains(boom.err, "TorchScript interpreter")) << boom.err;
  // A kernel's error inside the script while training (TorchScript rethrows it as a runtime_error).
  const auto misfit = run_cli("train" + mlp_on("data.pt", "misfit.pt") + " --epochs 1 --out " + out);
  EXPECT_EQ(misfit.code, 2);
  EXPECT_TRUE(contains(misfit.err, "mixtrain: error: the model's forward failed in fc (aten::linear): mat1 and mat2 shapes "
                                   "cannot be multiplied (32x3 and 7x10)"))
      << misfit.err;
  // A kernel's error inside a ModuleList: the layer and the op.
  const auto layers = run_cli("train" + mlp_on("data.pt", "layers.pt") + " --epochs 1 --out " + out);
  EXPECT_EQ(layers.code, 2);
  EXPECT_TRUE(contains(layers.err, "the model does not run on the data (in layers.1 (aten::linear)): mat1 and mat2 shapes "
                                   "cannot be multiplied (2x3 and 7x10)"))
      << layers.err;
}

TEST(CliBadInputTest, AFullDiskSaysWhatIsIntactAndHowToGoOn) {
  const std::string dir = test::scratch_dir("disk_full");
  // The size of the first epoch's checkpoint, from a run that is not limited.
  const auto sized = run_cli("train" + mlp_on("data.pt", "mlp.pt", 8) + " --epochs 2 --save-every 1 --out " + dir + "/sized");
  ASSERT_EQ(sized.code, 0) << sized.err;
  const auto first = fs::file_size(dir + "/sized/checkpoint-60.pt"), second = fs::file_size(dir + "/sized/checkpoint-120.pt");
  ASSERT_LT(first, second);  // the Recorder's history grows
  // A file-size limit between the two: the first checkpoint lands, the second cannot.
  // No `trap '' XFSZ`: the CLI ignores SIGXFSZ itself, or the limit would kill it without a word.
  const std::string limit = "exec prlimit --fsize=" + std::to_string((first + second) / 2) + " ";
  const std::string out = dir + "/run";
  const auto full = run_cli("train" + mlp_on("data.pt", "mlp.pt", 8) + " --epochs 2 --save-every 1 --out " + out, limit);
  EXPECT_EQ(full.code, 2) << full.err;
  EXPECT_TRUE(contains(full.err, "the newest checkpoint " + out + "/checkpoint-60.pt is intact: make room, then resume "
                                 "with: mixtrain train --resume " + out))
      << full.err;
  for (const auto& e : fs::directory_iterator(out)) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  const auto resumed = run_cli("train --resume " + out);
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(fs::exists(out + "/model.pt"));
}

// A state_dict (or a module pickled by torch.save) given as --model is said to be one, with
// what to pass instead, not reported as a damaged TorchScript file.
TEST(CliBadInputTest, AStateDictGivenAsTheModelIsSaidToBeOne) {
  for (const std::string file : {"mlp_state_dict.pt", "mlp_pickled.pt"}) {
    SCOPED_TRACE(file);
    test::expect_usage_error("train" + mlp_on("data.pt", file) + " --epochs 1 --out " + test::scratch_dir("state_dict_model"),
                             "is a torch.save'd file (a state_dict or a pickled module), not TorchScript");
  }
}

// The charts are written last, after model.pt and the finished mark: a chart that cannot be
// written says the run is whole, and does not send the user to a resume that is refused.
TEST(CliBadInputTest, AChartThatCannotBeWrittenSaysTheRunIsWhole) {
  const std::string out = test::scratch_dir("chart_blocked");
  fs::create_directories(out + "/loss.svg");  // a folder where the chart goes: its rename fails
  const auto r = run_cli("train" + mlp_on("data.pt") + " --epochs 1 --out " + out);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "after the run finished: model.pt and its logs are written, only its charts"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "resume")) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(fs::exists(out + "/model.pt"));
  EXPECT_TRUE(fs::exists(out + "/finished"));
}

TEST(CliBadInputTest, FlagsGivenTwiceOrEmptyAreSaidInOurWords) {
  test::expect_usage_error("train --bs 5 --bs 7", "--bs is given more than once; give it once");
  test::expect_usage_error("train --bs", "--bs needs a value");
  test::expect_usage_error("train --out ''", "an empty --out: name a folder");
  test::expect_usage_error("train --resume ''", "an empty --resume");
  test::expect_usage_error("train --data ''", "an empty --data: give it a value, or leave --data out for its default");
  test::expect_usage_error("doctor --model ''", "an empty --model");
}

// ---- [Crashes]: what a hostile tester broke with the landed code ---------------

// Real CPU bf16 autocast, forced on any CPU (the path is the same, only slower without
// bf16 units), with an fp32 island whose input is a bf16 activation: the island cast
// that input with our dispatcher key still on, the cast came back to the island, and
// it recursed until the stack overflowed (exit 139), in the doctor's own trial too.
TEST(CliBadInputTest, AnIslandFedABf16ActivationTrainsUnderRealCpuBf16) {
  for (const char* precision : {"bf16", "bf16-pure"}) {
    SCOPED_TRACE(precision);
    const std::string out = test::scratch_dir(std::string("island_real_bf16_") + precision);
    const auto r = run_cli("train" + mlp_on("data.pt", "normed_mlp.pt") + " --precision " + precision +
                               " --keep-fp32 ln1 --epochs 1 --force --out " + out,
                           "MIXTRAIN_CPU_BF16=1 ");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto summary = test::read_json(out + "/summary.json");
    EXPECT_FALSE(summary.at("emulated").get<bool>()) << "the real path ran, not the fallback";
    EXPECT_TRUE(std::isfinite(summary.at("valid_loss").get<double>()));
  }
  const std::string out = test::scratch_dir("island_real_bf16_builtin");
  const auto r = run_cli("train --model mlp --limit 512 --precision bf16-pure --keep-fp32 2 --epochs 1 --threads 1 --out " + out,
                         "MIXTRAIN_CPU_BF16=1 ");
  EXPECT_EQ(r.code, 0) << r.err;
}

// Under real CPU bf16 the model's own error was taken for a gap of the real path: the
// forward was rerun emulated and the run ended with exit 0. Only a dtype error falls back.
TEST(CliBadInputTest, TheModelsOwnErrorEndsARealBf16RunAsItEndsAnyOther) {
  for (const char* precision : {"fp32", "bf16", "bf16-pure"}) {
    SCOPED_TRACE(precision);
    const std::string out = test::scratch_dir(std::string("boom_later_") + precision) + "/run";
    const auto r = run_cli("train" + mlp_on("data.pt", "boom_later.pt") + " --precision " + precision + " --epochs 1 --out " + out,
                           "MIXTRAIN_CPU_BF16=1 ");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "boom at call 10")) << r.err;
    EXPECT_FALSE(contains(r.err, "cannot run this model")) << r.err;
  }
}

// A forward that hangs after the first step held one SIGTERM (which only asks for a
// checkpoint after the batch) for good: supervisors send exactly one.
TEST(CliBadInputTest, OneSigtermEndsARunWhoseForwardHangsAfterTheFirstSteps) {
  const std::string out = test::scratch_dir("sigterm_hang_later") + "/run";
  const auto start = std::chrono::steady_clock::now();
  // The model hangs at its 26th training step, in epoch 2; epoch 1's checkpoint has landed.
  const auto r = run_cli("train" + mlp_on("data.pt", "hang_later.pt") + " --epochs 2 --save-every 1 --out " + out,
                         "timeout --preserve-status -k 60 8 ");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_LT(seconds, 40) << "the SIGTERM was not obeyed";
  EXPECT_TRUE(contains(r.err, "the batch in flight did not end within 10 s of the stop signal; exiting without a new "
                              "checkpoint; the newest checkpoint is " + out + "/checkpoint-15.pt; resume with: mixtrain train "
                              "--resume " + out))
      << r.err;
}

// `timeout` signals the process and then its group: the two TERMs are one request, which
// saves a checkpoint (the second one used to exit at once, without one).
TEST(CliBadInputTest, TimeoutsTwoSignalsAreOneStopThatSavesACheckpoint) {
  const std::string out = test::scratch_dir("timeout_stop") + "/run";
  const auto r = run_cli("train" + mlp_on("data.pt") + " --epochs 100000 --out " + out, "timeout --preserve-status -k 60 4 ");
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_TRUE(contains(r.err, "mixtrain: interrupted; checkpoint saved to " + out + "/checkpoint-")) << r.err;
  EXPECT_FALSE(contains(r.err, "a second stop signal")) << r.err;
}

// A storage record shorter than the pickle claims: libtorch sized the storage by the
// claim and trained on (and wrote into) whatever lay past the record.
TEST(CliBadInputTest, AModelOrCheckpointWhoseRecordIsShorterThanItsClaimIsRefused) {
  const std::string cut = MIXTRAIN_SOURCE_DIR "/fuzz/regressions/scripted_model/l1-weight-record-cut.pt";
  EXPECT_THROW_WITH(load_scripted_model(cut), "tensor 'l1.weight' of shape [10, 64] needs 2560 bytes of data but the file "
                                              "holds 100 for it");
  // Deflated records are inflated where the check cannot see: refused as a whole (torch writes none).
  EXPECT_THROW_WITH(load_scripted_model(MIXTRAIN_SOURCE_DIR "/fuzz/regressions/scripted_model/compressed-record-cut.pt"),
                    "holds a compressed storage record (two_layer/data/0), which torch never writes");
  // Every kept regression input of the loader's fuzz target is a one-line error; every seed loads.
  for (const auto& entry : fs::directory_iterator(MIXTRAIN_SOURCE_DIR "/fuzz/regressions/scripted_model"))
    EXPECT_THROW(load_scripted_model(entry.path().string()), c10::Error) << entry.path();
  for (const auto& entry : fs::directory_iterator(MIXTRAIN_SOURCE_DIR "/fuzz/seeds/scripted_model"))
    EXPECT_NO_THROW(load_scripted_model(entry.path().string())) << entry.path();
  const std::string dir = test::scratch_dir("record_cut");
  const auto r = run_cli("train --model " + cut + " --data " + bad_input_file("data.pt") + " --epochs 1 --out " + dir + "/model_run");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/model_run"));
  // The same edit inside a checkpoint, its header's checksum recomputed.
  const std::string out = dir + "/run";
  ASSERT_EQ(run_cli("train" + mlp_on("data.pt") + " --epochs 2 --out " + out + " --interrupt-at-step 5").code, 130);
  std::string checkpoint;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) checkpoint = e.path().string();
  ASSERT_FALSE(checkpoint.empty());
  ASSERT_EQ(std::system((MIXTRAIN_PYTHON " " MIXTRAIN_SOURCE_DIR "/tests/python/cut_record.py " + checkpoint + " " +
                         checkpoint + " 280 100").c_str()),
            0);  // fc.weight: 10 x 7 floats
  const auto resumed = run_cli("train --resume " + out);
  EXPECT_EQ(resumed.code, 2) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "needs 280 bytes of data but the file holds 100 for it")) << resumed.err;
}

// args.json kept --data as typed (relative) and the checkpoint no fingerprint of it:
// a resume from elsewhere, or after the file was replaced, trained on other data.
TEST(CliBadInputTest, AResumeReadsTheSameFilesFromAnywhereOrSaysWhichChanged) {
  const std::string dir = test::scratch_dir("resume_inputs");
  fs::copy_file(bad_input_file("data.pt"), dir + "/data.pt");
  fs::copy_file(bad_input_file("mlp.pt"), dir + "/mlp.pt");
  const std::string out = dir + "/run";
  const auto cut = run_cli("train --model mlp.pt --data data.pt --bs 32 --threads 1 --epochs 2 --interrupt-at-step 5 --out " + out,
                           "cd " + dir + " && ");
  ASSERT_EQ(cut.code, 130) << cut.err;
  EXPECT_TRUE(contains(test::slurp(out + "/args.json"), "\"data\": \"" + dir + "/data.pt\"")) << test::slurp(out + "/args.json");
  // Another data file in its place: refused, naming it.
  fs::copy_file(bad_input_file("y_class_minus_1.pt"), dir + "/data.pt", fs::copy_options::overwrite_existing);
  auto r = run_cli("train --resume " + out);  // from the tests' own directory, not dir
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "cannot resume " + out + ": --data " + dir + "/data.pt is ")) << r.err;
  EXPECT_TRUE(contains(r.err, "but its checkpoints were trained on")) << r.err;
  // The file put back: the resume goes on, from any directory.
  fs::copy_file(bad_input_file("data.pt"), dir + "/data.pt", fs::copy_options::overwrite_existing);
  r = run_cli("train --resume " + out);
  EXPECT_EQ(r.code, 0) << r.err;
}

// summary.json's per-epoch shares dropped the epochs before a resume and miscounted the
// interrupted one (the totals were right).
TEST(CliBadInputTest, Bf16PureLostUpdateSharesPerEpochSurviveAResume) {
  const std::string dir = test::scratch_dir("lost_per_epoch");
  const std::string flags = "train" + mlp_on("data.pt") + " --precision bf16-pure --lr 1e-4 --epochs 3 --out ";
  ASSERT_EQ(run_cli(flags + dir + "/whole").code, 0);
  ASSERT_EQ(run_cli(flags + dir + "/cut --interrupt-at-step 20").code, 130);  // in epoch 2 of 15 steps each
  const auto resumed = run_cli("train --resume " + dir + "/cut");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  const auto whole = test::read_json(dir + "/whole/summary.json").at("lost_updates");
  const auto cut = test::read_json(dir + "/cut/summary.json").at("lost_updates");
  EXPECT_EQ(whole.at("per_epoch").size(), 3u) << whole;
  EXPECT_EQ(cut.at("per_epoch"), whole.at("per_epoch"));
  EXPECT_EQ(cut.at("fraction"), whole.at("fraction"));
}

TEST(CliBadInputTest, IslandsHoldingEveryParameterAreRefusedAsStarIs) {
  test::expect_usage_error("train --model " + bad_input_file("normed_mlp.pt") + " --data " + bad_input_file("data.pt") +
                               " --precision bf16 --keep-fp32 l1,ln1,l2 --out " + test::scratch_dir("all_islands") + "/run",
                           "keeps every parameter of the model in fp32: that is fp32 training, not an island");
}

} // namespace
