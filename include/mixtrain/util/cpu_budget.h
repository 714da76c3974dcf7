#pragma once
/// How many threads "all cores" means for this process on this machine.
///
/// std::thread::hardware_concurrency() counts the CPUs the kernel has online. A
/// process pinned by taskset or a cpuset, or held to a share of the machine by a
/// cgroup CPU quota (`docker --cpus`), may keep fewer busy, and OpenMP threads past
/// that share wait on each other at every parallel region: pinned to 1 of this
/// machine's 2 CPUs, a CNN epoch on 2 threads took 1.4-1.5x as long as on 1, and two
/// local ranks of `mixtrain launch` on 2 threads each 3-4x as long as on 1 (BENCHMARKS.md,
/// "The thread count a process may use").

#include <filesystem>
#include <string>
#include <vector>

namespace mixtrain {

/// What this process may use, as read from the machine (cpu_budget()).
struct CpuBudget {
  int online = 1;       ///< CPUs the kernel has online
  int affinity = 1;     ///< of them, the CPUs this process may run on (taskset, cpusets)
  int cores = 0;        ///< physical cores among those CPUs (hyperthread siblings counted once); 0: unknown
  double quota = 0;     ///< the cgroup's CPU quota in CPUs (docker --cpus); 0: none
  int env_threads = 0;  ///< OMP_NUM_THREADS, else MKL_NUM_THREADS, as a count; 0: unset
  int local_ranks = 1;  ///< processes of one job sharing this machine (LOCAL_WORLD_SIZE: mixtrain launch, torchrun)

  /// The CPUs this process may keep busy: its affinity, capped by the quota rounded up.
  int usable_cpus() const;
  /// This process's even share of them among the local ranks (at least 1).
  int cpus_per_rank() const;
  /// The threads "all cores" means. env_threads when set (torch reads the same two
  /// variables for its default); otherwise the physical cores among the usable CPUs,
  /// as torch's own default counts them (MKL's count; a hyperthread sibling adds no
  /// matrix unit), never more than the usable CPUs, and split evenly between the local
  /// ranks (at least 1 each): two ranks each on every core took 3-4x as long.
  int threads() const;
  /// The same before the split between local ranks.
  int unshared_threads() const;
  /// Why threads() is not every online CPU, in words for a run's header ("" when it is):
  /// "this process may run on 1 of 2 CPUs", "a CPU quota of 1.5 CPUs", ...
  std::string why() const;
};

/// This process's budget, read now: sched_getaffinity, /sys's CPU topology, the cgroup
/// files under /sys/fs/cgroup and the environment's OMP_NUM_THREADS, MKL_NUM_THREADS
/// and LOCAL_WORLD_SIZE. Reads that fail leave
/// their field at "unknown" or "none": it never throws.
CpuBudget cpu_budget();

/// The CPU quota, in CPUs, of the cgroup `proc_self_cgroup` (the text of
/// /proc/self/cgroup) names under `cgroup_root` (/sys/fs/cgroup): the smallest quota
/// of that cgroup and its ancestors, cgroup v2's cpu.max or v1's cpu.cfs_quota_us over
/// cpu.cfs_period_us. A container that shows its own cgroup at the mount's root while
/// /proc names the host's path is read at the root. 0 when no quota is set or nothing
/// can be read.
double cgroup_cpu_quota(const std::string& proc_self_cgroup, const std::filesystem::path& cgroup_root);

/// The physical cores among `cpus`, from `cpu_dir` (/sys/devices/system/cpu): CPUs with
/// the same package and core id count once. 0 when a CPU's topology cannot be read.
int physical_cores(const std::vector<int>& cpus, const std::filesystem::path& cpu_dir);

/// The thread count an OMP_NUM_THREADS-style value asks for: its leading positive count
/// ("4", "4,2" for nested levels: 4); 0 for null, empty or anything else.
int thread_count_from_env(const char* value);

} // namespace mixtrain
