// The launch (world) and the active replica group; eager collectives; worker assignment and
// batch splitting. Graph-op all-reduce lives in src/ops/collective.cpp.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/internal.h"
#include "cstorch/distributed.h"
#include "distributed/communicator.h"
#include "distributed/group.h"
#include "runtime/sync.h"

namespace cstorch::distributed {

namespace {
std::mutex g_mu;
std::shared_ptr<detail::Communicator> g_world;  // the launch
std::shared_ptr<detail::Communicator> g_group;  // active replica group (null: not a member)
std::atomic<detail::Communicator*> g_group_raw{nullptr};
int g_group_size = 1;
std::atomic<size_t> g_bucket_bytes{0};
std::atomic<double> g_collective_timeout{0};  // 0: the environment's or the default

std::shared_ptr<detail::Communicator> world_locked() {
  if (!g_world) {
    if (launched_by_mpi())
      g_world = detail::make_mpi_world();
    else
      g_world = std::make_shared<detail::LocalCommunicator>();
    g_group = g_world;
    g_group_raw = g_group.get();
    // Until a trainer sets a group, a launch of N processes is one group of N.
    g_group_size = g_world->size();
  }
  return g_world;
}

// Waits for queued steps unless called from a step closure (already in program order).
void drain() {
  if (!runtime::on_executor_thread()) runtime::synchronize();
}

detail::Communicator& member_group(const char* what) {
  std::lock_guard<std::mutex> l(g_mu);
  world_locked();
  CS_CHECK(g_group != nullptr, "{}: this process (rank {}) is not a member of the replica group",
           what, g_world->rank());
  return *g_group;
}
}  // namespace

namespace detail {
Communicator& active_group() {
  Communicator* c = g_group_raw.load(std::memory_order_acquire);
  if (c) return *c;
  std::lock_guard<std::mutex> l(g_mu);
  world_locked();
  CS_CHECK(g_group != nullptr,
           "collective: this process (rank {}) is not a member of the replica group",
           g_world->rank());
  return *g_group;
}
}  // namespace detail

bool launched_by_mpi() {
  return detail::launched_world_size() > 1 || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
         std::getenv("PMI_SIZE") != nullptr;
}

int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* v = std::getenv(name);
    if (!v) continue;
    const std::string s = v;
    CS_CHECK(!s.empty() && s.size() < 7 && s.find_first_not_of("0123456789") == std::string::npos,
             "{}='{}': a local rank must be a non-negative integer", name, s);
    return std::stoi(s);
  }
  return 0;
}

int world_size() {
  std::lock_guard<std::mutex> l(g_mu);
  return world_locked()->size();
}
int world_rank() {
  std::lock_guard<std::mutex> l(g_mu);
  return world_locked()->rank();
}

bool set_num_replicas(int n) {
  drain();
  std::lock_guard<std::mutex> l(g_mu);
  auto world = world_locked();
  CS_CHECK(n >= 1, "replicas: need at least 1 replica, got {}", n);
  if (n > world->size())
    fail(
        "cluster_config.num_csx is {} but this run was launched as {} process{}: launch it with "
        "`cszoo fit PARAMS --num_csx {}` (or `mpirun -np {} cszoo fit PARAMS --multireplica`)",
        n, world->size(), world->size() == 1 ? "" : "es", n, n);
  if (n == g_group_size && (g_group != nullptr) == (world->rank() < n)) return g_group != nullptr;
  std::shared_ptr<detail::Communicator> group;
  if (n == world->size())
    group = world;
  else if (n == 1)
    group = world->rank() == 0 ? std::make_shared<detail::LocalCommunicator>() : nullptr;
  else
    group = world->first(n);
  g_group = group;
  g_group_raw = group.get();
  g_group_size = n;
  return group != nullptr;
}

int num_replicas() {
  std::lock_guard<std::mutex> l(g_mu);
  world_locked();
  return g_group_size;
}
int replica_rank() {
  std::lock_guard<std::mutex> l(g_mu);
  world_locked();
  return g_group ? g_group->rank() : -1;
}
bool is_replica() {
  return replica_rank() >= 0;
}
bool is_main_process() {
  return world_rank() == 0;
}

// ---------------------------------------------------------------------------------------------
// State as bytes (for gather_state): a tag byte, then the value.

namespace {
enum Tag : uint8_t { kNone, kBool, kInt, kFloat, kString, kTensor, kList, kMap };

void put(std::string& out, const void* p, size_t n) {
  out.append(static_cast<const char*>(p), n);
}
template <class T>
void put(std::string& out, T v) {
  put(out, &v, sizeof v);
}
void put_str(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

void encode(const State& s, std::string& out) {
  switch (s.kind()) {
    case State::Kind::None:
      put<uint8_t>(out, kNone);
      break;
    case State::Kind::Bool:
      put<uint8_t>(out, kBool);
      put<uint8_t>(out, s.as_bool());
      break;
    case State::Kind::Int:
      put<uint8_t>(out, kInt);
      put<int64_t>(out, s.as_int());
      break;
    case State::Kind::Float:
      put<uint8_t>(out, kFloat);
      put<double>(out, s.as_double());
      break;
    case State::Kind::String:
      put<uint8_t>(out, kString);
      put_str(out, s.as_string());
      break;
    case State::Kind::Tensor: {
      const Tensor& t = s.as_tensor();
      put<uint8_t>(out, kTensor);
      put<uint8_t>(out, static_cast<uint8_t>(t.dtype()));
      put<uint64_t>(out, t.shape().size());
      for (auto d : t.shape()) put<int64_t>(out, d);
      const size_t nbytes = static_cast<size_t>(t.numel()) * itemsize(t.dtype());
      put(out, cstorch::detail::host_bytes(t, "gather_state").data(), nbytes);
      break;
    }
    case State::Kind::List:
      put<uint8_t>(out, kList);
      put<uint64_t>(out, s.size());
      for (auto& v : s.items()) encode(v, out);
      break;
    case State::Kind::Map:
      put<uint8_t>(out, kMap);
      put<uint64_t>(out, s.size());
      for (auto& k : s.keys()) {
        put_str(out, k);
        encode(s.at(k), out);
      }
      break;
  }
}

struct Reader {
  const std::string& in;
  size_t pos = 0;
  void get(void* p, size_t n) {
    CS_CHECK(pos + n <= in.size(), "gather_state: truncated state bytes at offset {}", pos);
    std::memcpy(p, in.data() + pos, n);
    pos += n;
  }
  template <class T>
  T get() {
    T v;
    get(&v, sizeof v);
    return v;
  }
  std::string str() {
    auto n = get<uint64_t>();
    CS_CHECK(n <= in.size() - pos, "gather_state: truncated string at offset {}", pos);
    std::string s = in.substr(pos, n);
    pos += n;
    return s;
  }
  State decode() {
    switch (get<uint8_t>()) {
      case kNone:
        return State();
      case kBool:
        return State(get<uint8_t>() != 0);
      case kInt:
        return State(get<int64_t>());
      case kFloat:
        return State(get<double>());
      case kString:
        return State(str());
      case kTensor: {
        auto dt = static_cast<DType>(get<uint8_t>());
        auto nd = get<uint64_t>();
        CS_CHECK(nd <= 16, "gather_state: tensor of rank {}", nd);
        Shape shape(nd);
        for (auto& d : shape) d = get<int64_t>();
        const size_t nbytes = static_cast<size_t>(numel(shape)) * itemsize(dt);
        CS_CHECK(nbytes <= in.size() - pos, "gather_state: truncated tensor at offset {}", pos);
        Tensor t = from_blob(in.data() + pos, shape, dt);
        pos += nbytes;
        return State(t);
      }
      case kList: {
        State l = State::list();
        auto n = get<uint64_t>();
        for (uint64_t i = 0; i < n; ++i) l.push_back(decode());
        return l;
      }
      case kMap: {
        State m = State::map();
        auto n = get<uint64_t>();
        for (uint64_t i = 0; i < n; ++i) {
          std::string k = str();
          m.set(k, decode());
        }
        return m;
      }
      default:
        fail("gather_state: bad tag at offset {}", pos - 1);
    }
  }
};
}  // namespace

std::vector<State> gather_state(const State& state, int root) {
  drain();
  auto& g = member_group("gather_state");
  CS_CHECK(root >= 0 && root < g.size(), "gather_state: root {} is not a replica (0..{})", root,
           g.size() - 1);
  std::string bytes;
  encode(state, bytes);
  std::vector<State> out;
  for (const auto& b : g.gather(bytes, root)) {
    Reader r{b};
    out.push_back(r.decode());
  }
  return out;
}

void broadcast_(const std::vector<Tensor>& tensors, int root) {
  drain();
  auto& g = member_group("broadcast_");
  CS_CHECK(root >= 0 && root < g.size(), "broadcast_: root {} is not a replica (0..{})", root,
           g.size() - 1);
  if (g.size() == 1) return;
  // One message: every tensor's bytes back to back.
  size_t total = 0;
  for (auto& t : tensors) total += static_cast<size_t>(t.numel()) * itemsize(t.dtype());
  std::vector<uint8_t> buf(total);
  size_t off = 0;
  for (auto& t : tensors) {
    size_t n = static_cast<size_t>(t.numel()) * itemsize(t.dtype());
    if (g.rank() == root)
      std::memcpy(buf.data() + off, cstorch::detail::host_bytes(t, "broadcast_").data(), n);
    off += n;
  }
  g.broadcast(buf.data(), total, root);
  if (g.rank() == root) return;
  NoGradGuard ng;
  off = 0;
  for (auto& t : tensors) {
    size_t n = static_cast<size_t>(t.numel()) * itemsize(t.dtype());
    Tensor(t).copy_(from_blob(buf.data() + off, t.shape(), t.dtype()));
    off += n;
  }
}

void barrier() {
  drain();
  member_group("barrier").barrier();
}

void abort(const std::string& message, int code) {
  std::shared_ptr<detail::Communicator> world;
  {
    std::lock_guard<std::mutex> l(g_mu);
    world = g_world;
  }
  const int size = world ? world->size() : detail::launched_world_size();
  const int rank = world ? world->rank() : detail::launched_world_rank();
  std::fprintf(stderr, "error: rank %d of %d: %s\n", rank, size, message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  if (world && world->size() > 1) world->abort(code);
  std::_Exit(code);
}

std::vector<int> workers_of_replica(int num_workers, int num_replicas, int replica) {
  CS_CHECK(num_replicas >= 1, "workers_of_replica: num_replicas must be >= 1, got {}",
           num_replicas);
  CS_CHECK(replica >= 0 && replica < num_replicas, "workers_of_replica: replica {} is not in 0..{}",
           replica, num_replicas - 1);
  CS_CHECK(num_workers >= num_replicas,
           "DataLoader: {} replicas need at least {} input workers (one per replica), got {}; set "
           "cluster_config.num_workers_per_csx >= 1 or the loader's num_workers >= {}",
           num_replicas, num_replicas, num_workers, num_replicas);
  std::vector<int> r;
  for (int w = replica; w < num_workers; w += num_replicas) r.push_back(w);
  return r;
}

int64_t replica_batch_size(int64_t global_batch, int num_replicas, int replica) {
  CS_CHECK(num_replicas >= 1 && replica >= 0 && replica < num_replicas,
           "replica_batch_size: replica {} of {}", replica, num_replicas);
  CS_CHECK(global_batch >= num_replicas,
           "batch_size {} cannot be split across {} replicas (each needs at least one sample)",
           global_batch, num_replicas);
  return global_batch / num_replicas + (replica < global_batch % num_replicas ? 1 : 0);
}

CommStats comm_stats() {
  std::lock_guard<std::mutex> l(g_mu);
  world_locked();
  if (!g_group) return {};
  return g_group->stats();
}

namespace detail {
double env_collective_timeout() {
  // Read once: the watchdog asks on every collective.
  static const double s = [] {
    const char* v = std::getenv("CSTORCH_COLLECTIVE_TIMEOUT_S");
    if (!v || !*v) return kDefaultCollectiveTimeout;
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    CS_CHECK(end != v && *end == '\0' && std::isfinite(x) && x > 0,
             "CSTORCH_COLLECTIVE_TIMEOUT_S='{}' is not a positive number of seconds", v);
    return x;
  }();
  return s;
}
std::string collective_timeout_origin() {
  if (g_collective_timeout.load() > 0) return "cluster_config.collective_timeout_s";
  const char* v = std::getenv("CSTORCH_COLLECTIVE_TIMEOUT_S");
  return v && *v ? "CSTORCH_COLLECTIVE_TIMEOUT_S" : "the default";
}
}  // namespace detail

void set_collective_timeout(double seconds) {
  CS_CHECK(std::isfinite(seconds) && seconds >= 0,
           "set_collective_timeout: {} is not a number of seconds >= 0 (0: the default)", seconds);
  g_collective_timeout = seconds;
}
double collective_timeout() {
  const double s = g_collective_timeout.load();
  return s > 0 ? s : detail::env_collective_timeout();
}

size_t bucket_bytes() {
  size_t b = g_bucket_bytes.load();
  if (b) return b;
  const char* v = std::getenv("CSTORCH_BUCKET_BYTES");
  long long x = v && *v ? std::atoll(v) : 0;
  return x > 0 ? static_cast<size_t>(x) : size_t{4} << 20;
}
void set_bucket_bytes(size_t bytes) {
  CS_CHECK(bytes > 0, "set_bucket_bytes: must be positive");
  g_bucket_bytes = bytes;
}

}  // namespace cstorch::distributed
