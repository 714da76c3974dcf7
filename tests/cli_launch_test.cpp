// mixtrain launch: data-parallel ranks on one machine and on two (network namespaces).
#include "cli_util.h"

#include <mixtrain/util/cpu_budget.h>
#include "test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

// run_cli, expect_usage_error, slurp, read_json, model_tensors, fake_fashion_dir, ...
using namespace mixtrain::test;

namespace {
using namespace mixtrain;
} // namespace

// ---- mixtrain launch ----------------------------------------------------------

namespace {

int launch_port() {
  static int port = 31000 + static_cast<int>(::getpid() % 500) * 4;
  return port++;
}

std::vector<std::string> crc_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.find("crc32") != std::string::npos) lines.push_back(line.substr(line.find("crc32")));
  return lines;
}

TEST(CliLaunchTest, TwoRanksEndIdenticalAndMatchOneProcessWithTheGlobalBatch) {
  const std::string dist = test::scratch_dir("launch_two"), single = test::scratch_dir("launch_single");
  const std::string common = " --model mlp --limit 4096 --epochs 1 --threads 1 --seed 5";
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) + " -- train" +
                              common + " --bs 64 --out " + dist);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[rank 0] mixtrain train:"), std::string::npos) << r.out;
  const auto crcs = crc_lines(r.out);
  ASSERT_EQ(crcs.size(), 2u) << r.out;
  EXPECT_EQ(crcs[0].substr(0, 14), crcs[1].substr(0, 14)) << r.out;  // "crc32 xxxxxxxx" equal on both ranks
  ASSERT_EQ(run_cli("train" + common + " --bs 128 --out " + single).code, 0);
  const auto a = read_json(dist + "/summary.json"), b = read_json(single + "/summary.json");
  EXPECT_NEAR(a.at("valid_accuracy").get<double>(), b.at("valid_accuracy").get<double>(), 0.01);
  EXPECT_NEAR(a.at("valid_loss").get<double>(), b.at("valid_loss").get<double>(), 0.01);
  EXPECT_EQ(r.out.find("[rank 1] epoch"), std::string::npos) << r.out;  // only rank 0 reports the table
}

TEST(CliLaunchTest, LocalRanksSplitTheCoresBetweenThemByDefault) {
  if (std::getenv("OMP_NUM_THREADS") || std::getenv("MKL_NUM_THREADS"))
    GTEST_SKIP() << "OMP_NUM_THREADS or MKL_NUM_THREADS chooses the count";
  // Each rank on every core oversubscribed them: 3-4x slower on this 2-core machine.
  const std::string dist = test::scratch_dir("launch_shared");
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) +
                              " -- train --model mlp --limit 1024 --epochs 1 --bs 64 --seed 5 --out " + dist);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  CpuBudget shared = cpu_budget();
  shared.local_ranks = 2;
  const int each = shared.threads();
  EXPECT_EQ(each, std::max(1, shared.unshared_threads() / 2));
  EXPECT_EQ(read_json(dist + "/summary.json").at("threads"), each);
  EXPECT_NE(r.out.find("[rank 0] mixtrain train: "), std::string::npos) << r.out;
  const std::string why = shared.why();  // "2 local ranks share 2 cores" on this machine
  EXPECT_NE(r.out.find(", " + std::to_string(each) + " thread(s)" + (why.empty() ? "" : " (" + why + ")") + ", 2 ranks"),
            std::string::npos) << r.out;
}

TEST(CliLaunchTest, ARankThatDiesEndsTheLaunchWithAClearErrorQuickly) {
  const auto start = std::chrono::steady_clock::now();
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) +
                              " -- train --model mlp --limit 4096 --epochs 2 --threads 1 --bs 64 --abort-at-step 5 --out " +
                              test::scratch_dir("launch_dies"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.code, 0);
  EXPECT_LT(seconds, 30.0);
  EXPECT_NE(r.err.find("mixtrain launch: rank 1 exited with code 134"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mixtrain launch: failed"), std::string::npos) << r.err;
}

TEST(CliLaunchTest, StochasticRoundingDrawsTheSameBitsOnEveryRank) {
  // bf16-pure with stochastic rounding: each rank rounds its (all-reduced, equal) update with
  // bits drawn from the seed, the step and the element, so the ranks end bitwise identical.
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) +
                              " -- train --model mlp --limit 2048 --epochs 1 --threads 1 --bs 64 --lr 1e-4"
                              " --precision bf16-pure --weight-update stochastic --out " +
                              test::scratch_dir("launch_stochastic"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto crcs = crc_lines(r.out);
  ASSERT_EQ(crcs.size(), 2u) << r.out;
  EXPECT_EQ(crcs[0].substr(0, 14), crcs[1].substr(0, 14)) << r.out;
}

TEST(CliLaunchTest, AnOverflowOnOneRankIsSkippedByBoth) {
  // --inject-overflow-at-step puts an inf into the last rank's gradients after the all-reduce.
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) +
                              " -- train --model mlp --limit 2048 --epochs 1 --threads 1 --bs 64 --precision fp16"
                              " --init-scale 256 --inject-overflow-at-step 4 --out " + test::scratch_dir("launch_overflow"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto crcs = crc_lines(r.out);
  ASSERT_EQ(crcs.size(), 2u) << r.out;
  for (const auto& line : crcs) EXPECT_NE(line.find("skipped 1,"), std::string::npos) << line;
  EXPECT_EQ(crcs[0].substr(0, 14), crcs[1].substr(0, 14)) << r.out;
}

TEST(CliLaunchTest, AnInterruptedLaunchResumesBitwiseEqualWithTheSameRanksOnly) {
  const std::string full = test::scratch_dir("launch_resume_full"), cut = test::scratch_dir("launch_resume_cut");
  const std::string flags = " --model mlp --limit 2048 --epochs 2 --threads 1 --bs 64 --save-every 1";
  auto launch = [](int nproc, const std::string& train_args) {
    return run_cli("launch --nproc " + std::to_string(nproc) + " --master-port " + std::to_string(launch_port()) +
                   " -- train" + train_args);
  };
  const CliResult whole = launch(2, flags + " --out " + full);
  ASSERT_EQ(whole.code, 0) << whole.out << whole.err;

  // A SIGINT on rank 1 only, after step 5: the stop request travels with the
  // next loss all-reduce, so both ranks stop after step 6 and rank 0 saves.
  const CliResult interrupted = launch(2, flags + " --out " + cut + " --interrupt-at-step 5");
  EXPECT_EQ(interrupted.code, 130) << interrupted.out << interrupted.err;
  EXPECT_NE(interrupted.out.find("resume with: mixtrain launch --nproc 2 -- train --resume " + cut), std::string::npos)
      << interrupted.out;
  EXPECT_NE(interrupted.err.find("mixtrain launch: interrupted; every rank stopped"), std::string::npos) << interrupted.err;
  EXPECT_EQ(interrupted.err.find("exited with code"), std::string::npos) << interrupted.err;  // not a failure
  ASSERT_TRUE(std::filesystem::exists(cut + "/checkpoint-6.pt"));

  // Another world size is refused, naming the mismatch, before anything changes.
  expect_usage_error("train --resume " + cut, "resume with: mixtrain launch --nproc 2 -- train --resume " + cut);
  const CliResult three = launch(3, " --resume " + cut);
  EXPECT_EQ(three.code, 2);
  EXPECT_NE(three.out.find("with 3 rank(s): it was trained by 2"), std::string::npos) << three.out;

  const CliResult resumed = launch(2, " --resume " + cut);
  ASSERT_EQ(resumed.code, 0) << resumed.out << resumed.err;
  const auto resumed_crcs = crc_lines(resumed.out), whole_crcs = crc_lines(whole.out);
  ASSERT_EQ(resumed_crcs.size(), 2u) << resumed.out;
  ASSERT_EQ(whole_crcs.size(), 2u) << whole.out;
  for (int k = 0; k < 2; ++k) EXPECT_EQ(resumed_crcs[k].substr(0, 14), whole_crcs[0].substr(0, 14));
  const auto a = model_tensors(full + "/checkpoint-32.pt"), b = model_tensors(cut + "/checkpoint-32.pt");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& kv : a) EXPECT_TRUE(torch::equal(kv.second, b.at(kv.first))) << kv.first;
}

TEST(CliLaunchTest, CtrlCAtTheTerminalStopsEveryRankOnceWithACheckpoint) {
  // A terminal's Ctrl-C sends SIGINT to its whole foreground process group. The
  // launcher runs here as the leader of such a group, as a shell would start it.
  const std::string data = test::fake_fashion_dir("launch_ctrl_c_data", 512, 64);
  const std::string out = test::scratch_dir("launch_ctrl_c"), log = out + ".log";
  std::filesystem::remove(log);  // an earlier run's log would look like training under way
  const std::vector<std::string> args = {
      MIXTRAIN_CLI_PATH, "launch", "--nproc", "2", "--master-port", std::to_string(launch_port()), "--", "train",
      "--data", data, "--model", "mlp", "--epochs", "500", "--threads", "1", "--bs", "16", "--out", out};
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  // Once rank 0 has finished an epoch, training is under way on both ranks.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (slurp(log).find("[rank 0] 0   ") == std::string::npos && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_NE(slurp(log).find("[rank 0] 0   "), std::string::npos) << slurp(log);
  ASSERT_EQ(::kill(-pid, SIGINT), 0);

  int status = 0;
  bool ended = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(ended = ::waitpid(pid, &status, WNOHANG) == pid) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!ended) {
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the launch did not stop within 60 s of one SIGINT\n" << slurp(log);
  }
  const std::string text = slurp(log);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;
  // Both ranks stopped together and rank 0 saved; the launcher did not take the
  // ranks' 130 for a failure. (A rank that got the terminal's SIGINT and the
  // launcher's forwarded one would exit at once, without a checkpoint; the two
  // usually merge into one pending signal, so this test cannot catch that race,
  // which the ranks' own process groups rule out.)
  EXPECT_NE(text.find("[rank 0] mixtrain: interrupted; checkpoint saved to " + out + "/checkpoint-"), std::string::npos) << text;
  EXPECT_NE(text.find("mixtrain launch: interrupted; every rank stopped"), std::string::npos) << text;
  EXPECT_EQ(text.find("exited with code"), std::string::npos) << text;
  const std::string latest = slurp(out + "/latest");
  ASSERT_FALSE(latest.empty());
  EXPECT_FALSE(model_tensors(out + "/" + latest.substr(0, latest.size() - 1)).empty());
}

TEST(CliLaunchTest, BadLaunchUsageIsAOneLineError) {
  expect_usage_error("launch --nproc 0 -- train", "--nproc: Value 0 not in range");
  expect_usage_error("launch --nproc 2", "launch runs 'train'");
  expect_usage_error("launch --nproc 2 --bogus -- train", "--bogus");
  expect_usage_error("launch -- train", "--nproc is required");
  expect_usage_error("train --comm-dtype int8", "unknown --comm-dtype 'int8' (choices: fp32, fp16)");
}

} // namespace

namespace {

// A launch in which a rank would get no full batch is refused before any rank trains.
TEST(CliRoughEdgesTest, ALaunchWhereARankGetsNoBatchIsRefused) {
  const std::string dir = test::fake_fashion_dir("cli_launch_small", 64, 32);
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) +
                              " -- train --data " + dir + " --bs 48 --model mlp --threads 1 --out " +
                              test::scratch_dir("cli_launch_small_out"));
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("(64 samples, 32 per rank of 2) is smaller than --bs 48"), std::string::npos) << r.out << r.err;
}

// A port another program listens on: rank 0 says so at once, and c10d's own log
// lines ("[E socket.cpp:...] [c10d] ...") stay out of the output.
TEST(CliRoughEdgesTest, APortInUseIsNamedAtOnce) {
  const int port = launch_port();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(fd, 4), 0);
  const std::string dir = test::fake_fashion_dir("cli_port_in_use", 64, 32);
  const auto start = std::chrono::steady_clock::now();
  const CliResult r = run_cli("launch --nproc 2 --master-port " + std::to_string(port) + " -- train --data " + dir +
                              " --bs 16 --model mlp --threads 1 --timeout 20 --out " + test::scratch_dir("cli_port_in_use_out"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(fd);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_LT(seconds, 15);
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("rank 0 cannot host the rendezvous: port " + std::to_string(port) + " is in use"), std::string::npos) << all;
  EXPECT_EQ(all.find("[c10d]"), std::string::npos) << all;
}

} // namespace

namespace {

// A rank whose MASTER_ADDR nobody listens on gives up after --timeout with one line
// naming the address it could not reach (not libtorch's message after 60 s).
TEST(CliRoughEdgesTest, AnUnreachableRendezvousIsNamedAfterTheTimeout) {
  const std::string dir = test::fake_fashion_dir("cli_rendezvous", 64, 32);
  const std::string err = std::string(MIXTRAIN_TEST_TMP) + "/rendezvous.err";
  const int port = launch_port();
  const std::string cmd = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                          " WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 " + MIXTRAIN_CLI_PATH + " train --data " + dir +
                          " --bs 16 --model mlp --threads 1 --timeout 2 >/dev/null 2>" + err;
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_LT(seconds, 30);
  const std::string text = slurp(err);
  EXPECT_NE(text.find("rank 1 could not reach the rendezvous at 127.0.0.1:" + std::to_string(port) + " (rank 0 hosts it) within 2 s"),
            std::string::npos) << text;
  // Our line is the last one, whole (libtorch's glog may log its socket timeout before it).
  const std::string last = text.substr(text.rfind('\n', text.size() - 2) + 1);
  EXPECT_EQ(last.rfind("mixtrain: error: rank 1 could not reach the rendezvous", 0), 0u) << text;
}

} // namespace

namespace {

/// Two "machines" on this one: network namespaces joined by a veth pair, private
/// addresses inside them only. Removed (with the veth) when the test ends.
struct TwoNodes {
  std::string a, b, va, vb;
  bool ok = false;
  TwoNodes() {
    const std::string id = std::to_string(::getpid() % 100000);
    a = "mtA" + id, b = "mtB" + id, va = "mtva" + id, vb = "mtvb" + id;
    const std::string setup = "ip netns add " + a + " && ip netns add " + b + " && ip link add " + va +
                              " type veth peer name " + vb + " && ip link set " + va + " netns " + a +
                              " && ip link set " + vb + " netns " + b + " && ip -n " + a + " addr add 10.231.0.1/24 dev " +
                              va + " && ip -n " + b + " addr add 10.231.0.2/24 dev " + vb + " && ip -n " + a +
                              " link set " + va + " up && ip -n " + b + " link set " + vb + " up && ip -n " + a +
                              " link set lo up && ip -n " + b + " link set lo up";
    ok = std::system((setup + " >/dev/null 2>&1").c_str()) == 0;
  }
  ~TwoNodes() {
    if (!ok) return;
    for (const std::string& ns : {a, b})  // nothing outlives the test: its processes, then the namespace
      std::system(("ip netns pids " + ns + " | xargs -r kill -9; ip netns del " + ns + " 2>/dev/null").c_str());
  }
  /// The launch command for node `rank` (0 in namespace a, 1 in b), output to `log`.
  std::string node(int rank, int port, const std::string& train, const std::string& log) const {
    return "ip netns exec " + (rank == 0 ? a : b) + " env GLOO_SOCKET_IFNAME=" + (rank == 0 ? va : vb) + " " +
           MIXTRAIN_CLI_PATH + " launch --nproc 1 --nnodes 2 --node-rank " + std::to_string(rank) +
           " --master-addr 10.231.0.1 --master-port " + std::to_string(port) + " -- train " + train + " >" + log +
           " 2>&1";
  }
};

std::string crc_of(const std::string& log) {
  const std::string text = slurp(log);
  const auto at = text.find("buffers crc32 ");
  return at == std::string::npos ? "" : text.substr(at + 14, 8);
}

// A real 2-node run on one machine: each node in its own network namespace, the
// rendezvous and Gloo over the veth. The nodes end bitwise identical; killing one
// node mid-run ends the other within seconds, naming the lost rank.
TEST(CliMultiNodeTest, TwoNodesEndIdenticalAndALostNodeIsNamedWithinSeconds) {
  TwoNodes net;
  if (!net.ok) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  const std::string dir = test::fake_fashion_dir("cli_multinode", 64, 32);
  const std::string tmp = std::string(MIXTRAIN_TEST_TMP);
  const std::string train = "--data " + dir + " --bs 16 --model mlp --threads 1 --timeout 20";
  int port = launch_port();
  const std::string log0 = tmp + "/node0.log", log1 = tmp + "/node1.log";
  ASSERT_EQ(std::system(("(" + net.node(0, port, train + " --out " + test::scratch_dir("multinode_out"), log0) + ") & " +
                         net.node(1, port, train, log1) + "; wait").c_str()),
            0)
      << slurp(log0) << slurp(log1);
  EXPECT_EQ(crc_of(log0).size(), 8u) << slurp(log0);
  EXPECT_EQ(crc_of(log0), crc_of(log1)) << slurp(log0) << slurp(log1);

  // A long run; node 1 dies (every process in its namespace, SIGKILL) after 3 s.
  port = launch_port() + 1;
  const std::string long_run = train + " --epochs 1000";
  const std::string done = tmp + "/node0.done";
  std::filesystem::remove(done);
  std::filesystem::remove(log0);
  std::system(("(" + net.node(0, port, long_run + " --force --out " + tmp + "/multinode_long", log0) + "; echo $? >" +
               done + ") & (" + net.node(1, port, long_run, log1) + ") &")
                  .c_str());
  // Once both nodes train (node 0 printed its second epoch's row; slow starts under
  // sanitizers take seconds), node 1 dies.
  const auto started = std::chrono::steady_clock::now();
  while (slurp(log0).find("[rank 0] 1 ") == std::string::npos && !std::filesystem::exists(done) &&
         std::chrono::steady_clock::now() - started < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_NE(slurp(log0).find("[rank 0] 1 "), std::string::npos) << slurp(log0) << slurp(log1);
  std::system(("ip netns pids " + net.b + " | xargs -r kill -9").c_str());
  const auto killed = std::chrono::steady_clock::now();
  while (!std::filesystem::exists(done) && std::chrono::steady_clock::now() - killed < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(seconds, 10.0) << "node 0 took " << seconds << " s to notice";
  EXPECT_NE(slurp(done), "0\n");
  EXPECT_NE(slurp(log0).find("lost rank 1"), std::string::npos) << slurp(log0);
}

// A launched run is branched in one process with its global batch: the same samples at
// each step, so the replay's first loss is the run's own to float rounding; not bitwise
// (the ranks' gradients add in another order), which the report says instead of a match.
TEST(CliLaunchTest, ALaunchedRunIsBranchedInOneProcessWithItsGlobalBatch) {
  const std::string run = test::scratch_dir("launch_branch_run");
  // 2048 samples, 2 ranks of bs 32: 32 global batches of 64 an epoch, 64 steps.
  const CliResult t = run_cli("launch --nproc 2 --master-port " + std::to_string(launch_port()) +
                              " -- train --model mlp --limit 2048 --epochs 2 --threads 1 --bs 32 --precision fp16"
                              " --save-every-steps 16 --out " + run);
  ASSERT_EQ(t.code, 0) << t.out << t.err;
  const std::string out = test::scratch_dir("launch_branch_doctor");
  const CliResult d = run_cli("doctor --from " + run + " --at 32 --window 16 --no-trials --out " + out);
  ASSERT_TRUE(d.code == 0 || d.code == 1) << d.out << d.err;
  EXPECT_NE(d.out.find("replayed in one process with their global batch of 64"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("not checked against the run: the run was trained by 2 ranks"), std::string::npos) << d.out;
  const auto j = read_json(out + "/diagnosis.json");
  EXPECT_TRUE(j.at("replay").at("matches_run").is_null()) << j.at("replay");
  EXPECT_EQ(j.at("evidence").at("mixed").at("steps"), 16);
  // first_loss is the mean of the window's first 5 losses: the run's steps 32-36 in
  // steps.csv (iter,epoch,loss,..., after a header), to the rounding of 5 steps.
  std::istringstream csv(slurp(run + "/steps.csv"));
  std::string line;
  double run_loss = 0;
  for (int row = -1; row <= 36 && std::getline(csv, line); ++row)
    if (row >= 32) run_loss += std::stod(line.substr(line.find(',', line.find(',') + 1) + 1)) / 5;
  ASSERT_EQ(line.rfind("36,1,", 0), 0u) << line;
  const double replayed = j.at("evidence").at("mixed").at("first_loss").get<double>();
  EXPECT_NEAR(replayed, run_loss, 1e-3 * run_loss) << "the replay's batches are not the run's steps 32-36";

  // train --from goes on in one process with the global batch, or with the run's ranks.
  const std::string next = test::scratch_dir("launch_branch_next");
  const CliResult one = run_cli("train --from " + run + " --at 48 --out " + next);
  ASSERT_EQ(one.code, 0) << one.out << one.err;
  EXPECT_NE(one.out.find("continued in one process with their global batch of 64"), std::string::npos) << one.out;
  EXPECT_EQ(read_json(next + "/args.json").at("bs"), 64);
  const CliResult three = run_cli("launch --nproc 3 --master-port " + std::to_string(launch_port()) + " -- train --from " +
                                  run + " --at 48 --force --out " + next);
  EXPECT_EQ(three.code, 2) << three.out << three.err;
  EXPECT_NE(three.out.find("cannot start 3 ranks from " + run + ": it was trained by 2 ranks"), std::string::npos) << three.out;
}

} // namespace
