// Branching a run: step checkpoints (--save-every-steps) and `mixtrain doctor --from`,
// which replays a window of a run from its own checkpoint instead of retraining.
#include "cli_util.h"
#include "test_util.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

using namespace mixtrain::test;

namespace {

namespace fs = std::filesystem;

// The mlp on 1024 Fashion-MNIST samples, bs 64: 16 steps an epoch, 32 in 2 epochs,
// a checkpoint every 8 steps (8, 16, 24, 32; 8 and 24 mid-epoch).
const std::string kRun = "train --model mlp --limit 1024 --bs 64 --epochs 2 --threads 1 --save-every-steps 8 ";

std::string trained(const std::string& name, const std::string& flags) {
  const std::string out = scratch_dir(name);
  const CliResult r = run_cli(kRun + flags + " --out " + out);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return out;
}

std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string() + ":" + std::to_string(fs::file_size(e.path())));
  return names;
}

TEST(CliBranchTest, StepCheckpointsLandEveryNStepsAndKeepCountsThem) {
  const std::string out = trained("branch_steps", "--precision fp16 --keep 3");
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"checkpoint-16.pt", "checkpoint-24.pt", "checkpoint-32.pt"}));
}

// A step checkpoint in the middle of an epoch resumes bitwise, as an epoch one does.
TEST(CliBranchTest, AMidEpochStepCheckpointResumesBitwise) {
  const std::string full = trained("branch_full", "--precision fp16");
  const std::string cut = scratch_dir("branch_cut");
  fs::copy(full, cut, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  for (const char* f : {"/checkpoint-16.pt", "/checkpoint-24.pt", "/checkpoint-32.pt", "/finished", "/model.pt"}) fs::remove(cut + f);
  const CliResult r = run_cli("train --resume " + cut);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("checkpoint-8.pt"), std::string::npos) << r.out;
  const auto a = model_tensors(full + "/checkpoint-32.pt"), b = model_tensors(cut + "/checkpoint-32.pt");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  EXPECT_EQ(slurp(full + "/steps.csv"), slurp(cut + "/steps.csv"));
}

// The replayed mixed arm is the run itself, in each mode that keeps a different state:
// autocast with a scaler, 16-bit weights, fp32 masters.
TEST(CliBranchTest, TheReplayMatchesTheRunInEachMode) {
  for (const std::string precision : {"fp16", "bf16-pure", "bf16-master"}) {
    SCOPED_TRACE(precision);
    const std::string run = trained("branch_match_" + precision, "--precision " + precision);
    const auto before = listing(run);
    const std::string out = scratch_dir("branch_match_doctor_" + precision);
    const CliResult r = run_cli("doctor --from " + run + " --at 8 --window 8 --no-trials --out " + out);
    ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out << r.err;
    EXPECT_NE(r.out.find("the run's own record"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("replay matches the run's steps.csv"), std::string::npos) << r.out;
    const auto j = read_json(out + "/diagnosis.json");
    const auto& replay = j.at("replay");
    EXPECT_EQ(replay.at("matches_run"), true) << replay;
    EXPECT_EQ(replay.at("step"), 8);
    EXPECT_EQ(replay.at("window"), 8);
    EXPECT_GT(replay.at("restore_seconds").get<double>(), 0) << replay;  // timed, where the bench reads it
    EXPECT_GT(replay.at("fp32_arm_seconds").get<double>(), 0) << replay;
    // Where a replayed window's time went, phase by phase (no trials asked: that phase is ~0).
    for (const char* phase : {"setup", "fp32", "run's setup", "run", "after", "trials"})
      EXPECT_GE(j.at("timing").at(phase).get<double>(), 0) << phase;
    EXPECT_GT(j.at("timing").at("fp32").get<double>(), 0);
    EXPECT_GT(j.at("timing").at("run").get<double>(), 0);
    EXPECT_EQ(j.at("evidence").at("fp32").at("steps"), 8);
    EXPECT_EQ(j.at("evidence").at("mixed").at("steps"), 8);
    EXPECT_EQ(listing(run), before) << "the doctor wrote into the run's folder";
  }
}

// The three doctors share one path for a stop: a --from doctor stopped during its trials
// keeps its verdict as interrupted and says where it is, as the doctor from scratch does.
TEST(CliBranchTest, ADoctorFromARunStoppedDuringItsTrialsKeepsTheDiagnosisAsInterrupted) {
  const std::string run = trained("branch_sigterm_run", "--precision fp16 --init-scale 1e-7");
  const std::string dir = scratch_dir("branch_sigterm"), out = dir + "/doctor", log = dir + "/log";
  const std::string doctor = std::string(MIXTRAIN_CLI_PATH) + " doctor --from " + run + " --at 8 --window 24 --out " + out;
  const std::string script = doctor + " > " + log + ".out 2> " + log + ".err & pid=$!; "
                             "while ! grep -q 'doctor: trial 1' " + log + ".out; do kill -0 $pid 2>/dev/null || break; sleep 0.1; done; "
                             "kill -TERM $pid; wait $pid; echo $? > " + log + ".code";
  ASSERT_EQ(std::system(script.c_str()), 0);
  const std::string err = slurp(log + ".err");
  ASSERT_NE(slurp(log + ".out").find("doctor: trial 1"), std::string::npos) << slurp(log + ".out") << err;
  EXPECT_EQ(std::stoi(slurp(log + ".code")), 130) << err;
  EXPECT_NE(err.find("mixtrain doctor: stopped during trial 1; verdict "), std::string::npos) << err;
  const auto j = read_json(out + "/diagnosis.json");
  EXPECT_EQ(j.at("trials_status"), "interrupted");
  EXPECT_EQ(j.at("replay").at("step"), 8);
}

// Before the verdict nothing is kept, and the stop says so in one line instead of nothing.
TEST(CliBranchTest, ADoctorStoppedBeforeItsVerdictSaysSo) {
  const std::string run = trained("branch_early_stop_run", "--precision fp16");
  const std::string dir = scratch_dir("branch_early_stop"), log = dir + "/log";
  const std::string doctor = std::string(MIXTRAIN_CLI_PATH) + " doctor --from " + run + " --at 8 --window 24 --out " + dir + "/doctor";
  const std::string script = doctor + " > " + log + ".out 2> " + log + ".err & pid=$!; "
                             "while ! grep -q 'doctor: 1/2' " + log + ".out; do kill -0 $pid 2>/dev/null || break; sleep 0.05; done; "
                             "kill -INT $pid; wait $pid; echo $? > " + log + ".code";
  ASSERT_EQ(std::system(script.c_str()), 0);
  const std::string err = slurp(log + ".err");
  EXPECT_EQ(std::stoi(slurp(log + ".code")), 130) << err;
  EXPECT_NE(err.find("mixtrain doctor: stopped before the verdict: nothing was kept"), std::string::npos) << err;
}

// A replay "matches" only where a loss was compared: with steps.csv's columns renamed
// nothing is, and the report says so instead of a match.
TEST(CliBranchTest, AReplayComparedWithNothingIsNoMatch) {
  const std::string run = trained("branch_renamed_columns", "--precision fp16");
  std::string csv = slurp(run + "/steps.csv");
  const size_t eol = csv.find('\n');
  std::string header = csv.substr(0, eol);
  for (const std::string column : {"loss", "scale", "skipped"}) {
    const size_t at = header.find(column);
    ASSERT_NE(at, std::string::npos) << header;
    header.replace(at, column.size(), "x_" + column);
  }
  write_text(run + "/steps.csv", header + csv.substr(eol));
  const std::string out = scratch_dir("branch_renamed_columns_doctor");
  const CliResult r = run_cli("doctor --from " + run + " --at 8 --window 8 --no-trials --out " + out);
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out << r.err;
  EXPECT_EQ(r.out.find("replay matches the run's steps.csv"), std::string::npos) << r.out;
  const auto replay = read_json(out + "/diagnosis.json").at("replay");
  EXPECT_TRUE(replay.at("matches_run").is_null()) << replay;
  EXPECT_NE(replay.at("not_compared").get<std::string>().find("no loss column"), std::string::npos) << replay;
}

// The step of a checkpoint is its own record: a file renamed to another step, or to the
// same step with a leading zero, is refused by name, not reported as the step it claims.
TEST(CliBranchTest, ACheckpointWhoseNameSaysAnotherStepIsRefused) {
  const std::string run = trained("branch_renamed_checkpoint", "--precision fp16");
  fs::rename(run + "/checkpoint-24.pt", run + "/checkpoint-12.pt");
  fs::rename(run + "/checkpoint-8.pt", run + "/checkpoint-08.pt");
  expect_usage_error("doctor --from " + run + " --at 12 --window 8 --no-trials --out " + scratch_dir("branch_renamed_12"),
                     "checkpoint-12.pt holds step 24, which its name does not say");
  expect_usage_error("doctor --from " + run + " --at 8 --window 8 --no-trials --out " + scratch_dir("branch_renamed_08"),
                     "checkpoint-08.pt holds step 8");
  expect_usage_error("train --from " + run + " --at 12 --out " + scratch_dir("branch_renamed_train"),
                     "checkpoint-12.pt holds step 24");
}

// A branch continues the run its checkpoint recorded: an args.json edited since, a data
// file replaced in place, or a checkpoint copied in from another run is refused by name,
// by train --from and doctor --from alike, as a resume refuses them.
TEST(CliBranchTest, ARunFolderEditedSinceItsCheckpointIsRefusedByName) {
  const std::string data = fake_fashion_dir("branch_edited_data", 512, 128);
  const std::string flags = "train --model mlp --data " + data + " --bs 64 --epochs 2 --threads 1 --save-every-steps 4 --precision fp16 ";
  const std::string run = scratch_dir("branch_edited_run");
  ASSERT_EQ(run_cli(flags + "--out " + run).code, 0);
  const std::string other_seed = scratch_dir("branch_edited_seed");
  ASSERT_EQ(run_cli(flags + "--seed 7 --out " + other_seed).code, 0);
  const std::string args = slurp(run + "/args.json");
  const auto edited = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = nlohmann::json::parse(args);
    j[key] = value;
    write_text(run + "/args.json", j.dump(2));
  };
  const auto both_refuse = [&](const std::string& what) {
    SCOPED_TRACE(what);
    expect_usage_error("train --from " + run + " --at 4 --out " + scratch_dir("branch_edited_train"), what);
    expect_usage_error("doctor --from " + run + " --at 4 --window 8 --no-trials --out " + scratch_dir("branch_edited_doctor"), what);
  };
  edited("lr", 0.1);
  both_refuse("args.json sets --lr 0.1 but " + run + "/checkpoint-4.pt was trained with --lr");
  edited("bs", 32);
  both_refuse("args.json sets --bs 32");
  edited("limit", 256);
  both_refuse("args.json sets --limit 256");
  edited("ranks", 2);
  both_refuse("args.json sets");
  edited("seed", 7);
  both_refuse("args.json sets --seed 7");
  write_text(run + "/args.json", args);
  // A checkpoint copied in from the run of another seed.
  fs::copy_file(other_seed + "/checkpoint-4.pt", run + "/checkpoint-4.pt", fs::copy_options::overwrite_existing);
  both_refuse("args.json sets --seed 42 but " + run + "/checkpoint-4.pt was trained with --seed 7");
  fs::copy_file(other_seed + "/checkpoint-8.pt", run + "/checkpoint-4.pt", fs::copy_options::overwrite_existing);
  both_refuse("checkpoint-4.pt holds step 8");
  // The data file replaced in place (args.json and the checkpoints unchanged): the replay
  // would be another run's, so it is refused before it trains, not reported as a difference.
  fs::remove(run + "/checkpoint-4.pt");
  write_gz(data + "/train-images-idx3-ubyte.gz", idx_bytes({512, 28, 28}, 0x08, /*fill_seed=*/3));
  expect_usage_error("train --from " + run + " --at 8 --out " + scratch_dir("branch_edited_train"), "was trained on");
  expect_usage_error("doctor --from " + run + " --at 8 --window 8 --no-trials --out " + scratch_dir("branch_edited_doctor"),
                     "was trained on");
}

// Without --at and --window: a finished run branches from the newest checkpoint that
// leaves a whole window; with fewer steps left anywhere, from the earliest, for what is left.
TEST(CliBranchTest, TheDefaultCheckpointLeavesTheLongestWindowThereIs) {
  const std::string run = trained("branch_default", "--precision fp16");
  const std::string out = scratch_dir("branch_default_doctor");
  const CliResult r = run_cli("doctor --from " + run + " --no-trials --out " + out);
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out << r.err;
  const auto replay = read_json(out + "/diagnosis.json").at("replay");
  EXPECT_EQ(replay.at("step"), 8);
  EXPECT_EQ(replay.at("window"), 24);
  EXPECT_EQ(replay.at("matches_run"), true);
}

// train --from with the run's own flags is the run itself, continued in a new folder;
// with another precision it finishes the schedule in that one, and the run's folder is untouched.
TEST(CliBranchTest, TrainFromContinuesTheRunInANewFolderAndInAnotherPrecision) {
  const std::string run = trained("branch_train_run", "--precision fp16");
  const auto before = listing(run);
  const std::string same = scratch_dir("branch_train_same");
  CliResult r = run_cli("train --from " + run + " --at 8 --out " + same);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("a new run from " + run + "/checkpoint-8.pt (step 8"), std::string::npos) << r.out;
  const auto a = model_tensors(run + "/checkpoint-32.pt"), b = model_tensors(same + "/checkpoint-32.pt");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  EXPECT_EQ(slurp(run + "/steps.csv"), slurp(same + "/steps.csv"));

  const std::string other = scratch_dir("branch_train_bf16");
  r = run_cli("train --from " + run + " --at 16 --precision bf16-pure --weight-update stochastic --out " + other);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto summary = read_json(other + "/summary.json");
  EXPECT_EQ(summary.at("precision"), "bf16-pure");
  EXPECT_EQ(summary.at("steps"), 32);  // the run's 16, then the 16 left
  EXPECT_TRUE(std::isfinite(summary.at("valid_loss").get<double>()));
  EXPECT_EQ(read_json(other + "/args.json").at("weight_update"), "stochastic");
  EXPECT_EQ(listing(run), before) << "train --from wrote into the run's folder";

  expect_usage_error("train --from " + run + " --at 8 --bs 32 --out " + scratch_dir("branch_train_bs"),
                     "--bs would make it another run");
  expect_usage_error("train --from " + run + " --at 8 --model cnn --out " + scratch_dir("branch_train_model"),
                     "--model would make it another run");
  expect_usage_error("train --from " + run + " --out " + scratch_dir("branch_train_end"), "finished its schedule");
  expect_usage_error("train --from " + run + " --at 8 --out " + run, "give it its own --out");
  expect_usage_error("train --from " + run + " --resume " + run, "do not pass --from");
}

// A run the NaN stop ended: its stop is shown as its own record, and a stop state whose
// weights are no longer finite is passed over for the checkpoint before it, said in a note.
TEST(CliBranchTest, AStoppedRunBranchesFromItsLastFiniteState) {
  const std::string run = scratch_dir("branch_stopped");
  const CliResult t = run_cli("train --model mlp --limit 2048 --bs 64 --epochs 2 --threads 1 --save-every-steps 8 "
                              "--precision bf16 --inject-overflow-at-step 20 --out " + run);
  ASSERT_EQ(t.code, 1) << t.out << t.err;
  ASSERT_TRUE(fs::exists(run + "/checkpoint-21.pt"));
  const std::string out = scratch_dir("branch_stopped_doctor");
  const CliResult r = run_cli("doctor --from " + run + " --no-trials --out " + out);
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out << r.err;
  EXPECT_NE(r.out.find("the NaN stop: the loss became NaN at step 21"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checkpoint-21.pt are NaN/inf: branched from the checkpoint before it"), std::string::npos) << r.out;
  const auto replay = read_json(out + "/diagnosis.json").at("replay");
  EXPECT_EQ(replay.at("step"), 16);
  EXPECT_EQ(replay.at("window"), 48);  // what the 64-step schedule has left
  EXPECT_EQ(replay.at("matches_run"), true);  // steps 16-20 were recorded before the stop
}

// The seed guide's "fine for a while, then NaN": a model whose last layer's outputs grow
// past fp16's range in its third epoch (fp32 is fine). The doctor from the NaN stop's state
// names the op and module and proves the island from there; train --from with that island,
// from a checkpoint before the trouble, finishes within 1.5% of the fp32 run's valid loss.
TEST(CliBranchTest, ARunThatGoesNanMidTrainingIsDiagnosedAndContinuedFromItsCheckpoint) {
  const std::string files = exported_by("export_branch_models.py");
  const std::string flags = "--model " + files + "/growing_model.pt --data " + files +
                            "/growing.pt --loss mse --bs 64 --epochs 6 --lr 0.3 --threads 1 ";
  const std::string fp32 = scratch_dir("branch_growing_fp32"), run = scratch_dir("branch_growing_fp16");
  ASSERT_EQ(run_cli("train " + flags + "--out " + fp32).code, 0);
  const CliResult t = run_cli("train " + flags + "--precision fp16 --save-every-steps 16 --out " + run);
  ASSERT_EQ(t.code, 1) << t.out << t.err;  // the NaN stop, mid-training
  EXPECT_NE(t.err.find("mixtrain: stopped: the loss was NaN/inf"), std::string::npos) << t.err;
  ASSERT_TRUE(fs::exists(run + "/checkpoint-32.pt"));

  // The run that stopped keeps its charts: the loss and the scale up to the stop.
  EXPECT_TRUE(fs::exists(run + "/loss.svg"));
  EXPECT_TRUE(fs::exists(run + "/scale.svg"));

  // By default the doctor branches before the run went wrong (its first NaN/inf loss), with
  // a window that reaches past it: the replay is the run's own, and the trials start from a
  // scale that works, not from the one the run's back-offs collapsed.
  const std::string out = scratch_dir("branch_growing_doctor");
  const CliResult r = run_cli("doctor --from " + run + " --out " + out);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("it went wrong at step 60 (its first NaN/inf loss): branched from " + run + "/checkpoint-48.pt, before it"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("replay matches the run's steps.csv"), std::string::npos) << r.out;
  const auto j = read_json(out + "/diagnosis.json");
  EXPECT_EQ(j.at("replay").at("step"), 48);
  EXPECT_EQ(j.at("verdict"), "forward_overflow");
  EXPECT_EQ(j.at("evidence").at("first_overflow").at("where"), "head (aten::linear)") << j.at("evidence");
  ASSERT_FALSE(j.at("proven_fix").is_null()) << r.out;
  EXPECT_EQ(j.at("proven_fix").at("flags"), "--keep-fp32 head");
  EXPECT_NE(r.out.find("continue the run with it: mixtrain train --from " + run + " --at 48"), std::string::npos) << r.out;
  // From the stop state the doctor still branches where asked, and says the trials' scale.
  const CliResult at_stop = run_cli("doctor --from " + run + " --at 90 --window 32 --no-trials --out " + scratch_dir("branch_growing_at_stop"));
  EXPECT_TRUE(at_stop.code == 0 || at_stop.code == 1) << at_stop.out << at_stop.err;

  const std::string cont = scratch_dir("branch_growing_continued");
  const CliResult c = run_cli("train --from " + run + " --at 32 --keep-fp32 head --out " + cont);
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  const double base = read_json(fp32 + "/summary.json").at("valid_loss"), fixed = read_json(cont + "/summary.json").at("valid_loss");
  EXPECT_TRUE(std::isfinite(fixed));
  EXPECT_LT(std::abs(fixed - base) / base, 0.015) << "fp32 " << base << ", continued with the island " << fixed;

  // Continued from the stop state with the proven island: not at the scale the run's
  // back-offs collapsed, but at the one its last skipped steps started from (said).
  const std::string island = scratch_dir("branch_growing_island_at_stop");
  const CliResult i = run_cli("train --from " + run + " --at 90 --keep-fp32 head --out " + island);
  ASSERT_EQ(i.code, 0) << i.out << i.err;
  EXPECT_NE(i.out.find("the run's loss scale had collapsed to"), std::string::npos) << i.out;
  EXPECT_TRUE(std::isfinite(read_json(island + "/summary.json").at("valid_loss").get<double>()));

  // Continued from the stop state in bf16: the new run's own table, counts and charts, not
  // the parent's inf and skips.
  const std::string bf16 = scratch_dir("branch_growing_bf16");
  const CliResult b = run_cli("train --from " + run + " --at 90 --precision bf16 --out " + bf16);
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  EXPECT_EQ(b.out.find(" inf "), std::string::npos) << b.out;
  const auto summary = read_json(bf16 + "/summary.json");
  EXPECT_TRUE(summary.at("train_loss").is_number()) << summary;
  EXPECT_EQ(summary.at("skipped_steps"), 0) << summary;
  EXPECT_TRUE(summary.at("final_scale").is_null()) << summary;
  // The parent's rows end where the new run's begin (its steps.csv holds 89: the NaN stop
  // records the state after its last step, whose loss row was the stop).
  const std::string parent_steps = slurp(run + "/steps.csv");
  const auto parent_rows = std::count(parent_steps.begin(), parent_steps.end(), '\n') - 1;
  EXPECT_EQ(summary.at("branched_at_step").get<int64_t>(), parent_rows) << summary;
  EXPECT_GT(summary.at("parent_skipped_steps").get<int>(), 0) << summary;
  const std::string steps = slurp(bf16 + "/steps.csv");
  size_t rows = 0;
  for (size_t at = steps.find('\n'); at != std::string::npos && at + 1 < steps.size(); at = steps.find('\n', at + 1)) {
    const std::string row = steps.substr(at + 1, steps.find('\n', at + 1) - at - 1);
    if (rows++ < static_cast<size_t>(parent_rows)) continue;
    const auto first_comma = row.find(','), second = row.find(',', first_comma + 1), third = row.find(',', second + 1),
               fourth = row.find(',', third + 1);
    EXPECT_TRUE(std::isfinite(std::stod(row.substr(third + 1, fourth - third - 1)))) << "smooth_loss of " << row;
  }
  EXPECT_GT(rows, static_cast<size_t>(parent_rows));
}

// The stall pure bf16 meets in the low-lr tail of its schedule: from a checkpoint in the
// last fifth the doctor says lost_updates and proves a cure; from the peak it does not.
TEST(CliBranchTest, ABf16PureRunThatStallsInItsCooldownIsLostUpdatesThereAndNotAtThePeak) {
  const std::string files = exported_by("export_branch_models.py");
  const std::string run = scratch_dir("branch_stalling");
  const CliResult t = run_cli("train --model " + files + "/stalling_model.pt --data " + files +
                              "/linear.pt --loss mse --bs 64 --epochs 5 --lr 2e-2 --threads 1 --precision bf16-pure "
                              "--save-every-steps 16 --out " + run);  // 320 steps, the peak at 80
  ASSERT_EQ(t.code, 0) << t.out << t.err;
  const std::string late = scratch_dir("branch_stalling_late"), peak = scratch_dir("branch_stalling_peak");
  const CliResult r = run_cli("doctor --from " + run + " --at 256 --max-trials 2 --out " + late);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const auto j = read_json(late + "/diagnosis.json");
  EXPECT_EQ(j.at("verdict"), "lost_updates") << r.out;
  EXPECT_EQ(j.at("replay").at("window"), 64);  // what the schedule has left
  ASSERT_FALSE(j.at("proven_fix").is_null()) << r.out;
  EXPECT_EQ(j.at("proven_fix").at("flags"), "--weight-update stochastic");
  const CliResult p = run_cli("doctor --from " + run + " --at 80 --max-trials 2 --out " + peak);
  EXPECT_EQ(p.code, 0) << p.out << p.err;
  EXPECT_EQ(read_json(peak + "/diagnosis.json").at("verdict"), "healthy") << p.out;
}

TEST(CliBranchTest, BadInputIsOneLineAndWritesNothingIntoTheRun) {
  const std::string run = trained("branch_bad", "--precision fp16");
  const auto before = listing(run);
  expect_usage_error("doctor --from " + run + " --at 5", "has no checkpoint at step 5 (it has steps 8, 16, 24, 32)");
  expect_usage_error("doctor --from " + run + " --window 0", "--window");
  expect_usage_error("doctor --from " + run + " --window 4", "too short to judge");
  expect_usage_error("doctor --from " + run + " --at 8 --window 30", "runs past the end of the run's schedule (32 steps): at most 24");
  expect_usage_error("doctor --from " + run + " --precision bf16", "replays the run with its own flags");
  expect_usage_error("doctor --from " + run + " --out " + run, "not into the run folder");
  expect_usage_error("doctor --from /nonexistent/run", "is not a run folder");
  expect_usage_error("doctor --at 8", "--at picks what --from replays");
  expect_usage_error("doctor --from " + run + " --at -3", "invalid --at -3");
  EXPECT_EQ(listing(run), before);

  // A run that kept no checkpoint, and one whose checkpoint is damaged.
  const std::string none = scratch_dir("branch_none");
  ASSERT_EQ(run_cli("train --model mlp --limit 512 --bs 64 --threads 1 --precision fp16 --out " + none).code, 0);
  expect_usage_error("doctor --from " + none, "holds no checkpoint");
  const std::string damaged = scratch_dir("branch_damaged");
  fs::copy(run, damaged, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  fs::resize_file(damaged + "/checkpoint-8.pt", fs::file_size(damaged + "/checkpoint-8.pt") / 2);
  expect_usage_error("doctor --from " + damaged + " --at 8", "checkpoint-8.pt is truncated");
  // A damaged newest checkpoint the doctor chose itself (a run that stopped): the older ones are named.
  fs::copy_file(run + "/checkpoint-8.pt", damaged + "/checkpoint-8.pt", fs::copy_options::overwrite_existing);
  fs::resize_file(damaged + "/checkpoint-32.pt", fs::file_size(damaged + "/checkpoint-32.pt") / 2);
  fs::remove(damaged + "/finished");
  expect_usage_error("doctor --from " + damaged + " --out " + scratch_dir("branch_damaged_doctor"),
                     "checkpoint-32.pt is truncated");
  EXPECT_NE(run_cli("doctor --from " + damaged + " --out " + scratch_dir("branch_damaged_doctor2")).err.find(
                "; the older checkpoints (steps 8, 16, 24) may be whole: pick one with --at"),
            std::string::npos);
  expect_usage_error("doctor --from " + run + " --at 32", "is at step 32, the end of the run's schedule (32 steps)");
  // A checkpoint another version of mixtrain wrote: its container version (bytes 8-11,
  // after "MIXTRAIN") is not this one's.
  const std::string older = scratch_dir("branch_older");
  fs::copy(run, older, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  {
    std::fstream f(older + "/checkpoint-8.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const char version_zero[4] = {0, 0, 0, 0};
    f.write(version_zero, 4);
  }
  expect_usage_error("doctor --from " + older + " --at 8", "checkpoint-8.pt has container version 0; this mixtrain reads version");
  expect_usage_error("doctor --from " + run + " --resume " + run, "--resume");
  // A run of fp32 has nothing to compare.
  const std::string fp32 = trained("branch_fp32", "--precision fp32");
  expect_usage_error("doctor --from " + fp32, "trained in fp32");
}

} // namespace
