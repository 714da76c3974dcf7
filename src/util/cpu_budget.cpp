#include "mixtrain/util/cpu_budget.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

namespace mixtrain {

namespace fs = std::filesystem;

namespace {

/// Keeps in `smallest` the smallest quota set so far (0: none set).
void keep_smallest(double& smallest, double quota) {
  if (quota > 0 && (smallest == 0 || quota < smallest)) smallest = quota;
}

/// The first line of a small /proc or /sys file; "" when it cannot be read.
std::string first_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

/// A whole decimal integer (optionally signed) and nothing else.
bool parse_integer(const std::string& text, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str()) return false;
  while (*end == ' ' || *end == '\t' || *end == '\n') ++end;
  if (*end != '\0') return false;
  out = v;
  return true;
}

/// cgroup v2's cpu.max: "max PERIOD" (none) or "QUOTA PERIOD", in microseconds.
double quota_v2(const fs::path& dir) {
  std::istringstream words(first_line(dir / "cpu.max"));
  std::string quota, period;
  words >> quota >> period;
  long long q = 0, p = 0;
  if (quota == "max" || !parse_integer(quota, q) || !parse_integer(period, p) || q <= 0 || p <= 0) return 0;
  return static_cast<double>(q) / static_cast<double>(p);
}

/// cgroup v1's CFS bandwidth: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
double quota_v1(const fs::path& dir) {
  long long q = 0, p = 0;
  if (!parse_integer(first_line(dir / "cpu.cfs_quota_us"), q) || !parse_integer(first_line(dir / "cpu.cfs_period_us"), p) ||
      q <= 0 || p <= 0)
    return 0;
  return static_cast<double>(q) / static_cast<double>(p);
}

/// The smallest quota on the way from `mount` down to `mount`/`cgroup` (each ancestor's
/// quota limits its children too). A cgroup path that is not there under the mount is a
/// container's view (/proc names the host's path, the mount shows the container's own
/// cgroup at its root): the root alone is read.
double smallest_quota_on_path(const fs::path& mount, const std::string& cgroup, double (*read)(const fs::path&)) {
  std::error_code ec;
  if (!fs::is_directory(mount, ec)) return 0;
  std::vector<fs::path> dirs{mount};
  fs::path dir = mount;
  for (const auto& part : fs::path(cgroup).relative_path()) {
    if (part.empty() || part == "." || part == "..") continue;  // /proc's paths have neither; never walk out
    dir /= part;
    dirs.push_back(dir);
  }
  if (!fs::is_directory(dirs.back(), ec)) dirs.resize(1);
  double smallest = 0;
  for (const auto& d : dirs) keep_smallest(smallest, read(d));
  return smallest;
}

/// The CPUs this process may run on (all online ones when the mask cannot be read).
std::vector<int> affinity_cpus(int online) {
  std::vector<int> cpus;
  for (int size = 1024; size <= (1 << 16) && cpus.empty(); size *= 2) {
    cpu_set_t* set = CPU_ALLOC(size);
    if (!set) break;
    const size_t bytes = CPU_ALLOC_SIZE(size);
    CPU_ZERO_S(bytes, set);
    if (::sched_getaffinity(0, bytes, set) == 0) {
      for (int c = 0; c < size; ++c)
        if (CPU_ISSET_S(c, bytes, set)) cpus.push_back(c);
      CPU_FREE(set);
      break;
    }
    const bool too_small = errno == EINVAL;
    CPU_FREE(set);
    if (!too_small) break;
  }
  if (cpus.empty())
    for (int c = 0; c < online; ++c) cpus.push_back(c);
  return cpus;
}

} // namespace

int CpuBudget::usable_cpus() const {
  int cpus = std::max(1, affinity);
  // A share of 1.5 CPUs keeps 2 threads running 3/4 of each period: more work than 1.
  if (quota > 0) cpus = std::min(cpus, std::max(1, static_cast<int>(std::ceil(quota - 1e-9))));
  return cpus;
}

int CpuBudget::cpus_per_rank() const { return std::max(1, usable_cpus() / std::max(1, local_ranks)); }

int CpuBudget::threads() const {
  if (env_threads > 0) return env_threads;
  return std::max(1, unshared_threads() / std::max(1, local_ranks));
}

int CpuBudget::unshared_threads() const {
  const int usable = usable_cpus();
  return std::max(1, cores > 0 ? std::min(cores, usable) : usable);
}

std::string CpuBudget::why() const {
  if (threads() == online) return "";
  if (env_threads > 0) return "as OMP_NUM_THREADS or MKL_NUM_THREADS asks";
  std::vector<std::string> parts;
  if (affinity < online)
    parts.push_back("this process may run on " + std::to_string(affinity) + " of " + std::to_string(online) + " CPUs");
  if (quota > 0 && usable_cpus() < std::max(1, affinity)) {
    std::ostringstream q;
    q << "its cgroup's CPU quota is " << quota << (quota == 1 ? " CPU" : " CPUs");
    parts.push_back(q.str());
  }
  if (cores > 0 && cores < usable_cpus())
    parts.push_back(std::to_string(cores) + (cores == 1 ? " physical core" : " physical cores"));
  if (local_ranks > 1)
    parts.push_back(std::to_string(local_ranks) + " local ranks share " + std::to_string(unshared_threads()) +
                    (unshared_threads() == 1 ? " core" : " cores"));
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

double cgroup_cpu_quota(const std::string& proc_self_cgroup, const fs::path& cgroup_root) {
  double smallest = 0;
  const auto take = [&](double q) { keep_smallest(smallest, q); };
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // hierarchy-ID:controller-list:cgroup-path (the path may itself hold colons)
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string id = line.substr(0, first), controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (id == "0" && controllers.empty()) {
      // cgroup v2: mounted at the root (unified), or beside v1's at unified/ (hybrid)
      take(smallest_quota_on_path(cgroup_root, path, quota_v2));
      take(smallest_quota_on_path(cgroup_root / "unified", path, quota_v2));
      continue;
    }
    std::set<std::string> names;
    std::istringstream list(controllers);
    for (std::string name; std::getline(list, name, ',');) names.insert(name);
    if (!names.count("cpu")) continue;
    // cgroup v1's cpu controller, mounted alone or joined with cpuacct (either order)
    for (const char* mount : {"cpu", "cpu,cpuacct", "cpuacct,cpu"}) take(smallest_quota_on_path(cgroup_root / mount, path, quota_v1));
  }
  return smallest;
}

int physical_cores(const std::vector<int>& cpus, const fs::path& cpu_dir) {
  std::set<std::pair<long long, long long>> cores;
  for (const int cpu : cpus) {
    const fs::path topology = cpu_dir / ("cpu" + std::to_string(cpu)) / "topology";
    long long package = 0, core = 0;
    if (!parse_integer(first_line(topology / "physical_package_id"), package) ||
        !parse_integer(first_line(topology / "core_id"), core))
      return 0;
    cores.insert({package, core});
  }
  return static_cast<int>(cores.size());
}

int thread_count_from_env(const char* value) {
  if (!value) return 0;
  const std::string text(value);
  const std::string head = text.substr(0, text.find(','));
  long long n = 0;
  if (!parse_integer(head, n) || n <= 0 || n > (1 << 16)) return 0;
  return static_cast<int>(n);
}

CpuBudget cpu_budget() {
  CpuBudget b;
  b.online = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  const std::vector<int> cpus = affinity_cpus(b.online);
  b.affinity = static_cast<int>(cpus.size());
  b.cores = physical_cores(cpus, "/sys/devices/system/cpu");
  std::ifstream cgroup("/proc/self/cgroup");
  std::stringstream text;
  text << cgroup.rdbuf();
  b.quota = cgroup_cpu_quota(text.str(), "/sys/fs/cgroup");
  b.env_threads = thread_count_from_env(std::getenv("OMP_NUM_THREADS"));
  if (b.env_threads == 0) b.env_threads = thread_count_from_env(std::getenv("MKL_NUM_THREADS"));
  b.local_ranks = std::max(1, thread_count_from_env(std::getenv("LOCAL_WORLD_SIZE")));
  return b;
}

} // namespace mixtrain
