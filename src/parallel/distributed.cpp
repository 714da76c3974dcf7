// c10d process groups. The c10d headers are the part of libtorch most likely to
// move between versions; they are included here only.
#include "mixtrain/parallel/distributed.h"

#include "util/first_line.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// NCCL for CUDA tensors, where torch was built with it (CMake defines USE_C10D_NCCL
// when the torch found has CUDA and nccl.h is found; ProcessGroupNCCL.hpp is empty otherwise).
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "mixtrain/compat.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mixtrain::distributed {

namespace {

/// The integer in environment variable `name`, or `fallback` when it is unset.
int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  TORCH_CHECK(end && *end == '\0' && n >= lo && n <= hi, "invalid environment variable ", name, "='", v,
              "' (expected an integer from ", lo, " to ", hi, ")");
  return static_cast<int>(n);
}

/// Whether another process listens on `port` already (rank 0 could not host the
/// store there). Binds as c10d's server does, dual-stack with SO_REUSEADDR, so a
/// port in TIME_WAIT from an earlier run is not mistaken for one in use.
bool port_in_use(int port) {
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;  // no IPv6 here: let c10d say what it finds
  const int on = 1, off = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_any;
  addr.sin6_port = htons(static_cast<uint16_t>(port));
  const bool in_use = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return in_use;
}

/// libtorch's own log lines ("[E socket.cpp:462] [c10d] ...") stay out of the
/// output while the group connects: what failed is the one-line error's to say.
struct QuietTorchLogs {
  int previous = mixtrain::compat::set_torch_min_log_level(3);
  ~QuietTorchLogs() { mixtrain::compat::set_torch_min_log_level(previous); }
};

} // namespace

Env env_from_environment() {
  Env e;
  e.world_size = env_int("WORLD_SIZE", 1, 1, 1 << 16);
  e.rank = env_int("RANK", 0, 0, 1 << 16);
  e.local_rank = env_int("LOCAL_RANK", e.rank, 0, 1 << 16);
  e.master_port = env_int("MASTER_PORT", 29500, 1, 65535);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) e.master_addr = addr;
  TORCH_CHECK(e.rank < e.world_size, "RANK=", e.rank, " is not below WORLD_SIZE=", e.world_size);
  return e;
}

/// Gloo has not always had bfloat16 (libtorch 1.13's had none): such tensors travel as float32 (exact
/// for a broadcast; a sum is rounded back to bf16 once, at the end).
template <typename Collective>
void via_supported_dtype(torch::Tensor& t, Collective&& collective) {
  if (t.scalar_type() != torch::kBFloat16) {
    collective(t);
    return;
  }
  torch::Tensor wide = t.to(torch::kFloat);
  collective(wide);
  t.copy_(wide);
}

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
#ifdef USE_C10D_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;  // made on the first CUDA tensor
#endif
  std::chrono::milliseconds timeout{60000};
  int rank = 0, world = 1;

  /// Gloo for CPU tensors; NCCL for CUDA tensors. Every rank meets its first CUDA
  /// tensor in the same collective, so every rank makes the NCCL group at the same
  /// point (its keys live under "nccl/" in the shared store, apart from Gloo's).
  c10d::Backend& backend_for(const torch::Tensor& t) {
    if (!t.is_cuda()) return *gloo;
#ifdef USE_C10D_NCCL
    if (!nccl) {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store), rank,
                                                         world, options);
    }
    return *nccl;
#else
    TORCH_CHECK(false, "this mixtrain was built against a torch without NCCL: data parallel on CUDA tensors needs "
                       "a CUDA build of torch (CPU tensors use Gloo)");
#endif
  }

  void run(c10::intrusive_ptr<c10d::Work> work, const char* what) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      const std::string lost = world == 2 ? "rank " + std::to_string(1 - rank) : "another rank";
      TORCH_CHECK(false, "distributed ", what, " failed on rank ", rank, ": lost ", lost,
                  " (it died, or did not answer within the timeout): ", detail::first_line(e.what()));
    }
  }

  void all_reduce(std::vector<torch::Tensor>& tensors, c10d::ReduceOp op) {
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    for (auto& t : tensors)
      via_supported_dtype(t, [&](torch::Tensor& x) {
        std::vector<torch::Tensor> one{x};
        run(backend_for(x).allreduce(one, o), "all-reduce");
      });
  }
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::connect(const Env& env, std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<Impl>();
  impl->rank = env.rank;
  impl->world = env.world_size;
  impl->timeout = timeout;
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = env.world_size;
  store_options.timeout = timeout;
  TORCH_CHECK(env.rank != 0 || !port_in_use(env.master_port), "rank 0 cannot host the rendezvous: port ", env.master_port,
              " is in use (another run, or another program?); pick a free one with mixtrain launch --master-port P, or MASTER_PORT");
  const QuietTorchLogs quiet;
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    // The Gloo device: this host's own address. On one machine that is loopback;
    // across machines GLOO_SOCKET_IFNAME picks the interface (as in PyTorch), else
    // the address this host's name resolves to.
    const std::string& addr = env.master_addr;
    const bool local = addr == "localhost" || addr.rfind("127.", 0) == 0;
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    options->devices.push_back(local    ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                               : ifname ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                                        : c10d::ProcessGroupGloo::createDefaultDevice());
    options->threads = 2;
    impl->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, env.rank, env.world_size, options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", env.rank, " could not reach the rendezvous at ", env.master_addr, ":", env.master_port,
                " (rank 0 hosts it) within ", timeout.count() / 1000.0,
                " s: is rank 0 running, and is MASTER_ADDR its address? (", detail::first_line(e.what()), ")");
  }
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::world_size() const { return impl_->world; }

void ProcessGroup::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  c10d::BroadcastOptions o;
  o.rootRank = root;
  for (auto& t : tensors)
    via_supported_dtype(t, [&](torch::Tensor& x) {
      std::vector<torch::Tensor> one{x};
      impl_->run(impl_->backend_for(x).broadcast(one, o), "broadcast");
    });
}

void ProcessGroup::all_reduce_sum(std::vector<torch::Tensor>& tensors) { impl_->all_reduce(tensors, c10d::ReduceOp::SUM); }
void ProcessGroup::all_reduce_max(std::vector<torch::Tensor>& tensors) { impl_->all_reduce(tensors, c10d::ReduceOp::MAX); }

void ProcessGroup::barrier() { impl_->run(impl_->gloo->barrier(), "barrier"); }

} // namespace mixtrain::distributed
