#include "launch.h"

#include "cli_options.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace mixtrain_cli {

namespace {

struct Rank {
  pid_t pid = -1;
  int fd = -1;          // read end of the rank's merged stdout/stderr
  std::string partial;  // an output line not yet ended
  bool running = true;
  int code = 0;
};

std::vector<pid_t> g_children;  // for the signal handler
std::atomic<int> g_forward_signal{0};

extern "C" void forward_signal(int sig) {
  g_forward_signal.store(sig);
  for (pid_t pid : g_children)
    if (pid > 0) ::kill(pid, sig);
}

void emit(int rank, const std::string& line) {
  std::cout << "[rank " << rank << "] " << line << "\n" << std::flush;
}

/// Reads what is available; prints complete lines. Returns false at end of stream.
bool pump(int rank, Rank& r) {
  char buf[4096];
  const ssize_t n = ::read(r.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!r.partial.empty()) emit(rank, r.partial);
    r.partial.clear();
    return false;
  }
  r.partial.append(buf, static_cast<size_t>(n));
  size_t nl;
  while ((nl = r.partial.find_first_of("\n\r")) != std::string::npos) {
    if (nl > 0) emit(rank, r.partial.substr(0, nl));
    r.partial.erase(0, nl + 1);
  }
  return true;
}

} // namespace

CLI::App* add_launch_subcommand(CLI::App& app, LaunchOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "launch", "Run N local ranks of a data-parallel job: mixtrain launch --nproc N [--master-port P] "
                "[--master-addr A] [--nnodes M --node-rank I] -- train [train flags]. Ctrl-C stops every rank at the "
                "same batch; rank 0 saves a checkpoint and the launch exits 130. --bs is per rank");
  cmd->add_option("--nproc", o.nproc, "Ranks to start on this machine (1 to 256)")->check(CLI::Range(1, 256))->required();
  cmd->add_option("--master-port", o.master_port, "Port of the rendezvous store rank 0 hosts")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  cmd->add_option("--master-addr", o.master_addr, "Address of rank 0's machine")->capture_default_str();
  cmd->add_option("--nnodes", o.nnodes, "Machines in the job (torchrun's name; each runs this command)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--node-rank", o.node_rank, "This machine's index, 0 to nnodes-1")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  return cmd;
}

void check_launch(const LaunchOptions& o, const std::vector<std::string>& command) {
  if (command.empty() || command[0] != "train")
    throw UsageError("launch runs 'train': mixtrain launch --nproc N [--master-port P] -- train [flags]");
  if (o.node_rank >= o.nnodes)
    throw UsageError("invalid --node-rank " + std::to_string(o.node_rank) + ": must be below --nnodes " +
                     std::to_string(o.nnodes));
}

int launch(const std::string& exe, const std::vector<std::string>& args, const LaunchOptions& o) {
  std::vector<Rank> ranks(o.nproc);
  g_children.assign(o.nproc, -1);
  const pid_t launcher = ::getpid();
  for (int k = 0; k < o.nproc; ++k) {
    int fds[2];
    if (::pipe(fds) != 0) {
      std::perror("mixtrain launch: pipe");
      return 2;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("mixtrain launch: fork");
      return 2;
    }
    if (pid == 0) {
      // Its own process group: a Ctrl-C at the terminal reaches the launcher
      // only, which forwards it once. Had the ranks received it from the
      // terminal as well, they would count two signals and exit at once,
      // without the checkpoint that one signal asks for.
      ::setpgid(0, 0);
      // Out of the terminal's reach, a rank must still not outlive its launcher.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(1);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      ::setenv("RANK", std::to_string(o.node_rank * o.nproc + k).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(k).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(o.nnodes * o.nproc).c_str(), 1);
      // torchrun's too: the ranks on this machine split its cores between them (cpu_budget).
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(exe.c_str()));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      std::fprintf(stderr, "mixtrain launch: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    ::close(fds[1]);
    ranks[k].pid = pid;
    ranks[k].fd = fds[0];
    g_children[k] = pid;
  }

  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  int first_failure = -1;
  bool interrupted = false;
  using clock = std::chrono::steady_clock;
  clock::time_point stop_deadline{};
  bool killed = false;
  auto open_streams = [&] {
    int n = 0;
    for (const auto& r : ranks) n += r.fd >= 0;
    return n;
  };
  auto running = [&] {
    int n = 0;
    for (const auto& r : ranks) n += r.running;
    return n;
  };
  while (open_streams() > 0 || running() > 0) {
    std::vector<pollfd> pfds;
    std::vector<int> owner;
    for (int k = 0; k < o.nproc; ++k)
      if (ranks[k].fd >= 0) {
        pfds.push_back({ranks[k].fd, POLLIN, 0});
        owner.push_back(k);
      }
    if (!pfds.empty()) {
      ::poll(pfds.data(), pfds.size(), 100);
      for (size_t i = 0; i < pfds.size(); ++i)
        if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))
          if (!pump(o.node_rank * o.nproc + owner[i], ranks[owner[i]])) {
            ::close(ranks[owner[i]].fd);
            ranks[owner[i]].fd = -1;
          }
    } else {
      ::usleep(100 * 1000);
    }
    // Reap ranks that ended.
    for (int k = 0; k < o.nproc; ++k) {
      Rank& r = ranks[k];
      if (!r.running) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      g_children[k] = -1;
      r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      // 130 is an interrupted rank (mixtrain train's code, or 128 + SIGINT): the
      // stop travels through the group, the others stop at the same batch and
      // rank 0 saves a checkpoint, so nobody is hurried. Should a peer hang
      // instead, the process group's timeout fails it.
      if (r.code == kExitInterrupted) interrupted = true;
      if (r.code != 0 && r.code != kExitInterrupted && first_failure < 0) {
        first_failure = k;
        if (running() > 0) {
          std::cerr << "mixtrain launch: rank " << o.node_rank * o.nproc + k << " exited with code " << r.code
                    << "; stopping the other ranks"
                    << std::endl;
          for (const auto& other : ranks)
            if (other.running) ::kill(other.pid, SIGTERM);
          stop_deadline = clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.kill_after_seconds * 1000));
        }
      }
    }
    if (first_failure >= 0 && !killed && running() > 0 && clock::now() > stop_deadline) {
      for (const auto& other : ranks)
        if (other.running) ::kill(other.pid, SIGKILL);
      killed = true;
    }
  }
  if (first_failure < 0 && interrupted) {
    std::cerr << "mixtrain launch: interrupted; every rank stopped" << std::endl;
    return kExitInterrupted;
  }
  if (first_failure < 0) return 0;
  const int code = ranks[first_failure].code;
  std::cerr << "mixtrain launch: failed: rank " << o.node_rank * o.nproc + first_failure << " exited with code " << code
            << std::endl;
  return code;
}

} // namespace mixtrain_cli
