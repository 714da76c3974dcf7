// A user's run folders are theirs: no path form of --out reaches into a run that is there,
// the doctor writes only into a folder of its own, and no file the CLI reads from a run
// folder can hang it or eat its memory (a FIFO, a link to a device).
#include "cli_util.h"
#include "test_util.h"

#include <sys/stat.h>

#include <filesystem>
#include <set>

using namespace mixtrain::test;

namespace {

namespace fs = std::filesystem;

// 16 steps an epoch, a checkpoint every 8.
const std::string kFolderRun = "train --model mlp --limit 1280 --bs 64 --epochs 1 --threads 1 --save-every-steps 8 ";

std::set<std::string> checkpoints_of(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) names.insert(e.path().filename().string());
  return names;
}

std::string finished_run(const std::string& name, const std::string& flags = "") {
  const std::string out = scratch_dir(name);
  const CliResult r = run_cli(kFolderRun + flags + "--out " + out);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return out;
}

/// Exit non-zero, within the timeout, with one line on stderr that contains `substr`.
void expect_refused_in_one_line(const CliResult& r, const std::string& substr) {
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.code, 124) << "timed out: the read blocked\n" << r.out << r.err;
  EXPECT_NE(r.err.find(substr), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// `OLD/x/..` with no x yet: the check looked into OLD/x (nothing there), and creating
// the folder landed in OLD, whose checkpoints a new run then removed.
TEST(CliRunFolderTest, NoPathFormOfAFinishedRunLetsANewRunRemoveItsCheckpoints) {
  const std::string run = finished_run("folder_old");
  const auto before = checkpoints_of(run);
  ASSERT_EQ(before.size(), 2u);
  const std::string alias = scratch_dir("folder_old_alias") + "/alias";  // a link to the run, and through it
  fs::create_directory_symlink(run, alias);
  for (const std::string& form : {run + "/", run + "/x/..", run + "/./", run + "/x/y/../..", run + "//", alias, alias + "/x/.."}) {
    SCOPED_TRACE(form);
    expect_usage_error(kFolderRun + "--out " + form, "holds a finished run");
    EXPECT_EQ(checkpoints_of(run), before);
  }
}

// A finished run that wrote no checkpoint is a run too: its model.pt and args.json were
// overwritten by the next train into the same folder (Python refused it; the CLI did not).
TEST(CliRunFolderTest, ARunWithoutCheckpointsIsNotOverwrittenByTheNextTrain) {
  const std::string out = scratch_dir("folder_no_checkpoints");
  const std::string run = "train --model mlp --limit 640 --bs 64 --epochs 1 --threads 1 --out " + out;
  ASSERT_EQ(run_cli(run).code, 0);
  ASSERT_TRUE(checkpoints_of(out).empty());
  const std::string model = slurp(out + "/model.pt");
  expect_usage_error(run + " --lr 0.5", "holds a finished run; name another folder, or pass --force to start over there");
  EXPECT_EQ(slurp(out + "/model.pt"), model);
  EXPECT_EQ(run_cli(run + " --lr 0.5 --force").code, 0);
  EXPECT_NE(slurp(out + "/model.pt"), model);
  // A run that stopped before its first checkpoint (not finished, none kept) left nothing to
  // resume or keep: the next run takes its folder, as a fixed command is run again.
  fs::remove(out + "/finished");
  EXPECT_EQ(run_cli(run).code, 0);
}

TEST(CliRunFolderTest, TrainFromRefusesEveryPathFormOfItsOwnSource) {
  const std::string run = finished_run("folder_source");
  const auto before = checkpoints_of(run);
  for (const std::string& form : {run + "/", run + "/y/..", run + "/./y/../"}) {
    SCOPED_TRACE(form);
    expect_usage_error("train --from " + run + " --at 8 --threads 1 --out " + form, "give it its own");
    EXPECT_EQ(checkpoints_of(run), before);
  }
}

// The doctor writes loss.svg, scale.svg and diagnosis.json: into another run's folder
// they would overwrite that run's charts.
TEST(CliRunFolderTest, TheDoctorRefusesAFolderThatHoldsARun) {
  const std::string run = finished_run("folder_doctor_target", "--precision fp16 ");
  const std::string svg = slurp(run + "/loss.svg");
  ASSERT_FALSE(svg.empty());
  expect_usage_error("doctor --model mlp --limit 1280 --bs 64 --epochs 1 --threads 1 --out " + run + "/z/..", "holds a run");
  const std::string other = scratch_dir("folder_doctor_other");
  fs::copy(run, other, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  expect_usage_error("doctor --from " + other + " --at 8 --threads 1 --out " + run, "holds a run");
  EXPECT_EQ(slurp(run + "/loss.svg"), svg);
}

// A FIFO blocks a plain read until a writer comes; /dev/zero never ends.
TEST(CliRunFolderTest, ARunFolderFileThatIsNoRegularFileIsRefusedNotRead) {
  const std::string run = finished_run("folder_fifo_source", "--precision fp16 ");
  struct Case {
    std::string file, command;
  };
  const std::string dir = scratch_dir("folder_fifo");
  for (const Case& c : {Case{"args.json", "train --resume "}, Case{"steps.csv", "doctor --threads 1 --at 8 --from "},
                        Case{"summary.json", "doctor --threads 1 --at 8 --from "}}) {
    for (const bool fifo : {true, false}) {
      SCOPED_TRACE(c.file + (fifo ? " as a FIFO" : " as a link to /dev/zero"));
      const std::string copy = dir + "/" + c.file + (fifo ? "-fifo" : "-zero");
      fs::remove_all(copy);
      fs::copy(run, copy, fs::copy_options::recursive);
      fs::remove(copy + "/finished");
      fs::remove(copy + "/" + c.file);
      if (fifo) ASSERT_EQ(::mkfifo((copy + "/" + c.file).c_str(), 0600), 0);
      else fs::create_symlink("/dev/zero", copy + "/" + c.file);
      const std::string out = c.command.rfind("doctor", 0) == 0 ? " --out " + copy + "-doctor" : "";
      const CliResult r = run_cli(c.command + copy + out, "timeout 60 ");
      expect_refused_in_one_line(r, "not a regular file");
    }
  }
}

} // namespace
