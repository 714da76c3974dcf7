// cpu_budget: "all cores" is what this process may use (its CPU affinity, its cgroup's
// quota, physical cores, OMP_NUM_THREADS), not every CPU the kernel has online.
#include "cli_util.h"

#include <mixtrain/mixtrain.h>
#include <mixtrain/util/cpu_budget.h>

#include <ATen/Parallel.h>
#include <sched.h>

#include <cstdlib>
#include <thread>

namespace {

using namespace mixtrain;
namespace fs = std::filesystem;

/// A file under a fake /sys tree.
void put(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  test::write_text(file.string(), text + "\n");
}

bool thread_variables_set() { return std::getenv("OMP_NUM_THREADS") || std::getenv("MKL_NUM_THREADS"); }

TEST(CpuBudgetTest, CgroupV2QuotaIsTheSmallestOnTheWayDownToTheProcesssCgroup) {
  const fs::path root = test::scratch_dir("cpu_budget_v2");
  put(root / "cpu.max", "max 100000");
  put(root / "work.slice" / "cpu.max", "300000 100000");
  put(root / "work.slice" / "job" / "cpu.max", "max 100000");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("0::/work.slice/job\n", root), 3.0);  // the parent's quota holds its child
  put(root / "work.slice" / "job" / "cpu.max", "150000 100000");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("0::/work.slice/job\n", root), 1.5);
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("0::/\n", root), 0.0);  // the root: no quota
  // A container's view: /proc names the host's path, the mount shows the container's own cgroup.
  put(root / "cpu.max", "50000 100000");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("0::/system.slice/docker-abc.scope\n", root), 0.5);
}

TEST(CpuBudgetTest, CgroupV1QuotaIsReadWhereverTheCpuControllerIsMounted) {
  const fs::path root = test::scratch_dir("cpu_budget_v1");
  put(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1");
  put(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000");
  put(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "250000");
  put(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000");
  const std::string proc = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n";
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(proc, root), 2.5);
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("4:cpu,cpuacct:/\n", root), 0.0);  // -1: no quota
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("12:memory:/docker/abc\n", root), 0.0);  // no cpu controller named
  // A lone cpu mount (this machine's layout) read at its root from a path it does not show.
  put(root / "cpu" / "cpu.cfs_quota_us", "100000");
  put(root / "cpu" / "cpu.cfs_period_us", "100000");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("3:cpu:/docker/other\n", root), 1.0);
}

TEST(CpuBudgetTest, UnreadableOrMalformedCgroupFilesMeanNoQuota) {
  const fs::path root = test::scratch_dir("cpu_budget_bad");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("", root), 0.0);
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("0::/\n", root / "absent"), 0.0);
  for (const std::string bad : {"", "max", "100000", "abc 100000", "100000 0", "-5 100000", "1e5 100000"}) {
    put(root / "cpu.max", bad);
    EXPECT_DOUBLE_EQ(cgroup_cpu_quota("0::/\n", root), 0.0) << '"' << bad << '"';
  }
  put(root / "cpu" / "cpu.cfs_quota_us", "200000");  // no period beside it
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("3:cpu:/\n", root), 0.0);
  // Lines that are not hierarchy:controllers:path, and a path that tries to climb out.
  put(root / "cpu.max", "100000 100000");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota("garbage\n::\n0::/../../..\n", root), 1.0);
}

TEST(CpuBudgetTest, HyperthreadSiblingsCountAsOneCore) {
  const fs::path cpu = test::scratch_dir("cpu_budget_topology");
  // Two packages of two cores, each core with two hyperthreads: CPUs 0-7.
  for (int c = 0; c < 8; ++c) {
    put(cpu / ("cpu" + std::to_string(c)) / "topology" / "physical_package_id", std::to_string(c / 4));
    put(cpu / ("cpu" + std::to_string(c)) / "topology" / "core_id", std::to_string((c / 2) % 2));
  }
  EXPECT_EQ(physical_cores({0, 1, 2, 3, 4, 5, 6, 7}, cpu), 4);
  EXPECT_EQ(physical_cores({0, 1}, cpu), 1);     // one core's two siblings
  EXPECT_EQ(physical_cores({0, 2, 4}, cpu), 3);  // core ids repeat across packages
  EXPECT_EQ(physical_cores({0, 9}, cpu), 0);     // CPU 9's topology is not there: unknown
}

TEST(CpuBudgetTest, OmpNumThreadsIsReadAsTorchReadsIt) {
  EXPECT_EQ(thread_count_from_env(nullptr), 0);
  EXPECT_EQ(thread_count_from_env("4"), 4);
  EXPECT_EQ(thread_count_from_env("4,2"), 4);  // nested levels: the outer one
  for (const char* bad : {"", "0", "-3", "four", "4x", "99999999999"}) EXPECT_EQ(thread_count_from_env(bad), 0) << bad;
}

TEST(CpuBudgetTest, ThreadsAreThePhysicalCoresThisProcessMayUse) {
  CpuBudget b;
  b.online = 16, b.affinity = 16, b.cores = 8;
  EXPECT_EQ(b.threads(), 8);  // hyperthreads add no matrix unit: torch's own default counts cores
  EXPECT_EQ(b.why(), "8 physical cores");
  b.affinity = 2, b.cores = 1;  // pinned to one core's two siblings
  EXPECT_EQ(b.threads(), 1);
  EXPECT_EQ(b.why(), "this process may run on 2 of 16 CPUs; 1 physical core");
  b.affinity = 16, b.cores = 0, b.quota = 1.5;  // docker --cpus 1.5, topology unknown
  EXPECT_EQ(b.usable_cpus(), 2);
  EXPECT_EQ(b.threads(), 2);
  EXPECT_EQ(b.why(), "its cgroup's CPU quota is 1.5 CPUs");
  b.quota = 0.2;
  EXPECT_EQ(b.threads(), 1);  // never 0
  b.env_threads = 3;
  EXPECT_EQ(b.threads(), 3);  // the user's count stands, as in torch
  EXPECT_EQ(b.why(), "as OMP_NUM_THREADS or MKL_NUM_THREADS asks");
  CpuBudget ranks;  // mixtrain launch --nproc 3 on 8 cores: 2 threads each, not 8
  ranks.online = ranks.affinity = ranks.cores = 8, ranks.local_ranks = 3;
  EXPECT_EQ(ranks.threads(), 2);
  EXPECT_EQ(ranks.why(), "3 local ranks share 8 cores");
  EXPECT_EQ(ranks.cpus_per_rank(), 2);  // what the --threads warning counts
  ranks.local_ranks = 16;
  EXPECT_EQ(ranks.threads(), 1);
  ranks.env_threads = 2;
  EXPECT_EQ(ranks.threads(), 2);  // OMP_NUM_THREADS is per process, as torchrun sets it
  CpuBudget all;
  all.online = all.affinity = all.cores = 4;
  EXPECT_EQ(all.threads(), 4);
  EXPECT_EQ(all.why(), "");
}

TEST(CpuBudgetTest, APinnedProcessTrainsOnTheCpusItMayUse) {
  if (thread_variables_set()) GTEST_SKIP() << "OMP_NUM_THREADS or MKL_NUM_THREADS chooses the count";
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const CpuBudget pinned = cpu_budget();
  const int set = configure_threads(0);
  const int torch_threads = at::get_num_threads();
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  EXPECT_EQ(pinned.affinity, 1);
  // hardware_concurrency() still counts every online CPU: the old count, and why it oversubscribed.
  EXPECT_EQ(pinned.online, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(set, 1);
  EXPECT_EQ(torch_threads, 1);
  if (pinned.online > 1) EXPECT_NE(pinned.why().find("this process may run on 1 of "), std::string::npos) << pinned.why();
  configure_threads(1);
}

TEST(CpuBudgetTest, TheRunHeaderSaysWhyItTookFewerThreadsAndWarnsPastTheCpusItMayUse) {
  if (thread_variables_set()) GTEST_SKIP() << "OMP_NUM_THREADS or MKL_NUM_THREADS chooses the count";
  if (std::system("command -v taskset >/dev/null 2>&1") != 0) GTEST_SKIP() << "no taskset (util-linux) here";
  const std::string dir = test::fake_fashion_dir("cpu_budget_cli", 64, 32);
  const std::string out = test::scratch_dir("cpu_budget_out");
  const std::string base = "train --data " + dir + " --bs 16 --model mlp --epochs 1 --out " + out;
  const test::CliResult pinned = test::run_cli(base + " --force", "taskset -c 0 ");
  ASSERT_EQ(pinned.code, 0) << pinned.err;
  if (std::thread::hardware_concurrency() > 1)
    EXPECT_NE(pinned.out.find(", 1 thread(s) (this process may run on 1 of "), std::string::npos) << pinned.out;
  else
    EXPECT_NE(pinned.out.find(", 1 thread(s)\n"), std::string::npos) << pinned.out;
  const auto summary = test::read_json(out + "/summary.json");
  EXPECT_EQ(summary.at("threads"), 1);
  const test::CliResult over = test::run_cli(base + " --threads 2 --force", "taskset -c 0 ");
  EXPECT_EQ(over.code, 0) << over.err;
  EXPECT_NE(over.err.find("--threads 2 is more than the 1 CPU(s) this process may use"), std::string::npos) << over.err;
  EXPECT_NE(over.out.find(", 2 thread(s)\n"), std::string::npos) << over.out;  // a count given is kept, and not explained
}

} // namespace
