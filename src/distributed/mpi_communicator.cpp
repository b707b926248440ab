// The MPI communicator (Open MPI on CPU). One communication thread owns MPI: it initialises
// it, runs every collective, and finalises it at exit. Kernels and the Trainer hand it work
// through a FIFO, so a bucket's all-reduce proceeds while the executor thread computes the
// rest of the backward pass (true overlap, without relying on MPI's asynchronous progress).
// Every collective is nonblocking and polled (a short spin, then 20 us sleeps, so the thread
// does not take a core from the compute on a small machine); one that has not completed after
// the watchdog time (cluster_config.collective_timeout_s, else CSTORCH_COLLECTIVE_TIMEOUT_S,
// else 300 s) stops every rank with a message naming the limit and, for ranks on this host, the
// rank that stopped or died. A rank the launcher terminates (SIGTERM: mpirun stops the launch
// when another rank died) says which rank on this host has exited before it goes.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cstorch/core/error.h"
#include "distributed/communicator.h"
#include "runtime/sync.h"

#ifdef CSTORCH_HAVE_MPI
// The C API only (Open MPI's header would otherwise pull in its deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace cstorch::distributed::detail {

std::shared_ptr<Communicator> LocalCommunicator::first(int n) {
  CS_CHECK(n >= 1, "replica group: need at least 1 replica, got {}", n);
  return std::make_shared<LocalCommunicator>();
}

void LocalCommunicator::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

int launched_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* v = std::getenv(var);
    if (v && *v) return std::max(1, std::atoi(v));
  }
  return 1;
}

int launched_world_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    const char* v = std::getenv(var);
    if (v && *v) return std::max(0, std::atoi(v));
  }
  return 0;
}

#ifndef CSTORCH_HAVE_MPI

std::shared_ptr<Communicator> make_mpi_world() {
  fail(
      "this process was started by an MPI launcher, but cstorch was built without MPI "
      "(install libopenmpi-dev: scripts/setup.sh, then rebuild)");
}

#else

namespace {

// Every rank's process id and host, gathered once at start-up: a rank that waits too long, or is
// terminated by the launcher, can tell which rank on its own host has stopped or exited.
struct Peers {
  int rank = 0, size = 1;
  std::vector<long> pids;
  std::vector<bool> same_host;
};
// Written once before the SIGTERM handler is installed, then only read; never destroyed, as
// the handler may run after static destructors (the launcher terminates a rank that is exiting).
Peers& g_peers = *new Peers;

// The state of process `pid` from /proc/PID/stat (the letter after the command's ')'): 'T'
// stopped, 'Z' exited and not yet reaped, 0 when there is no such process. Async-signal-safe
// (open, read, close only).
char process_state(long pid) {
  char path[32] = "/proc/";
  int n = 6;
  char digits[24];
  int d = 0;
  for (long p = pid; p > 0 && d < 20; p /= 10) digits[d++] = static_cast<char>('0' + p % 10);
  while (d > 0) path[n++] = digits[--d];
  const char* tail = "/stat";
  for (int i = 0; tail[i]; ++i) path[n++] = tail[i];
  path[n] = 0;
  int fd = ::open(path, O_RDONLY);
  if (fd < 0) return 0;
  char buf[512];
  ssize_t got = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (got <= 0) return 0;
  int close_paren = -1;
  for (ssize_t i = 0; i < got; ++i)
    if (buf[i] == ')') close_paren = static_cast<int>(i);
  if (close_paren < 0 || close_paren + 2 >= got) return 0;
  return buf[close_paren + 2];
}

// Appends `s` to buf (capacity cap, always terminated); async-signal-safe.
void append(char* buf, size_t cap, size_t& len, const char* s) {
  while (*s && len + 1 < cap) buf[len++] = *s++;
  buf[len] = 0;
}
void append_int(char* buf, size_t cap, size_t& len, long v) {
  char digits[24];
  int d = 0;
  if (v == 0) digits[d++] = '0';
  for (; v > 0 && d < 20; v /= 10) digits[d++] = static_cast<char>('0' + v % 10);
  char out[24];
  int n = 0;
  while (d > 0) out[n++] = digits[--d];
  out[n] = 0;
  append(buf, cap, len, out);
}

// "; rank 1 (pid 42) is stopped (SIGSTOP or a debugger)" for each other rank on this host that
// is stopped or has exited; `exited_only` leaves out stopped ranks. Async-signal-safe. Returns
// how many ranks it named.
int describe_peers(char* buf, size_t cap, size_t& len, bool exited_only) {
  int named = 0;
  for (int r = 0; r < g_peers.size; ++r) {
    if (r == g_peers.rank || !g_peers.same_host[r]) continue;
    const char st = process_state(g_peers.pids[r]);
    const bool exited = st == 0 || st == 'Z' || st == 'X' || st == 'x';
    const bool stopped = st == 'T' || st == 't';
    if (!exited && !(stopped && !exited_only)) continue;
    append(buf, cap, len, "; rank ");
    append_int(buf, cap, len, r);
    append(buf, cap, len, " (pid ");
    append_int(buf, cap, len, g_peers.pids[r]);
    append(buf, cap, len, exited ? ") has exited" : ") is stopped (SIGSTOP or a debugger)");
    ++named;
  }
  return named;
}

// mpirun terminates the other ranks (SIGTERM, then SIGKILL) when one dies; say which rank on
// this host has exited, then die of the signal as before.
void on_terminate(int sig) {
  static char buf[1024];
  size_t len = 0;
  append(buf, sizeof buf, len, "cstorch: rank ");
  append_int(buf, sizeof buf, len, g_peers.rank);
  append(buf, sizeof buf, len, " of ");
  append_int(buf, sizeof buf, len, g_peers.size);
  append(buf, sizeof buf, len, ": terminated by the launcher");
  describe_peers(buf, sizeof buf, len, true);
  append(buf, sizeof buf, len, "\n");
  ssize_t ignored = ::write(2, buf, len);
  (void)ignored;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// The thread that owns MPI.
class MpiThread {
 public:
  MpiThread() {
    // A bad CSTORCH_COLLECTIVE_TIMEOUT_S is an error here, on the caller's thread.
    env_collective_timeout();
    thread_ = std::thread([this] { loop(); });
    // MPI is initialised on the thread (MPI_THREAD_FUNNELED: only it calls MPI).
    run([this] {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      // Every rank's pid and host name.
      struct Id {
        long pid;
        char host[64];
      } me{};
      me.pid = static_cast<long>(::getpid());
      ::gethostname(me.host, sizeof me.host - 1);
      std::vector<Id> all(static_cast<size_t>(world_size_));
      MPI_Request req;
      MPI_Iallgather(&me, sizeof(Id), MPI_BYTE, all.data(), sizeof(Id), MPI_BYTE, MPI_COMM_WORLD,
                     &req);
      complete(req, "start-up exchange", 0);
      g_peers.rank = world_rank_;
      g_peers.size = world_size_;
      for (const auto& id : all) {
        g_peers.pids.push_back(id.pid);
        g_peers.same_host.push_back(std::strncmp(id.host, me.host, sizeof me.host) == 0);
      }
    });
    struct sigaction sa {};
    sa.sa_handler = on_terminate;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
  }

  // Runs `f` on the thread after the queued work; returns at once.
  void submit(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> l(m_);
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  // Runs `f` on the thread and waits for it; rethrows its exception.
  void run(std::function<void()> f) {
    std::mutex dm;
    std::condition_variable dcv;
    bool done = false;
    std::exception_ptr err;
    submit([&] {
      try {
        f();
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> l(dm);
      done = true;
      dcv.notify_one();
    });
    std::unique_lock<std::mutex> l(dm);
    dcv.wait(l, [&] { return done; });
    if (err) std::rethrow_exception(err);
  }

  // Polls `req` to completion (on the thread); the watchdog stops the launch on a hang.
  void complete(MPI_Request& req, const char* what, uint64_t serial) {
    auto t0 = std::chrono::steady_clock::now();
    const double timeout = collective_timeout();
    int flag = 0;
    for (int spins = 0;; ++spins) {
      int rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING] = {0};
        int len = 0;
        MPI_Error_string(rc, text, &len);
        die(fmt::format("{} #{} failed (MPI error {}: {})", what, serial, rc, text), false);
      }
      if (flag) return;
      if (spins < 64) {
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > timeout)
        die(fmt::format("{} #{} did not complete within {:g} s", what, serial, timeout), true);
    }
  }

  // Prints why this rank stops the launch (naming the other ranks on this host that stopped or
  // exited: this rank is the one that noticed, not the one that failed), then stops it.
  // `timed_out`: also say where the limit comes from and how to change it.
  [[noreturn]] void die(const std::string& msg, bool timed_out = false) {
    char peers[1024];
    size_t len = 0;
    peers[0] = 0;
    const bool named = describe_peers(peers, sizeof peers, len, false) > 0;
    std::string text = fmt::format("cstorch: rank {} of {}: {}{}", world_rank_, world_size_, msg,
                                   named ? peers : "; another rank has stopped, hangs or failed");
    if (timed_out)
      text += fmt::format(
          ". The limit ({:g} s, from {}) is set by trainer.init.backend.cluster_config."
          "collective_timeout_s in the YAML config or the environment variable "
          "CSTORCH_COLLECTIVE_TIMEOUT_S (the config wins; default {:g} s)",
          collective_timeout(), collective_timeout_origin(), kDefaultCollectiveTimeout);
    std::fflush(stdout);
    std::fprintf(stderr, "%s; stopping every rank\n", text.c_str());
    std::fflush(stderr);
    // This rank said why; the launcher's SIGTERM while it aborts needs no second line.
    ::signal(SIGTERM, SIG_DFL);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  // Finalises MPI and joins the thread (at exit, after the executor drained).
  void shutdown() {
    run([] {
      int fin = 0;
      MPI_Finalized(&fin);
      if (!fin) MPI_Finalize();
    });
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  int world_rank() const { return world_rank_; }

 private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }

  int world_rank_ = 0, world_size_ = 1;
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()> > q_;
  bool stop_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MpiThread* t, MPI_Comm comm) : t_(t), comm_(comm) {
    const char* tr = std::getenv("CSTORCH_TRACE_COLLECTIVES");
    trace_ = tr && *tr && *tr != '0';
    t_->run([&] {
      MPI_Comm_rank(comm_, &rank_);
      MPI_Comm_size(comm_, &size_);
    });
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "mpi"; }

  uint64_t start_allreduce(float* data, size_t n) override {
    CS_CHECK(n <= static_cast<size_t>(INT32_MAX), "all_reduce: a bucket of {} values is too large",
             n);
    const uint64_t ticket = issued_++;
    if (trace_)
      std::fprintf(stderr, "cstorch: rank %d: all-reduce #%llu of %zu values\n", rank_,
                   static_cast<unsigned long long>(ticket), n);
    t_->submit([this, data, n, ticket] {
      auto t0 = std::chrono::steady_clock::now();
      MPI_Request req;
      int rc =
          MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_, &req);
      if (rc != MPI_SUCCESS) t_->die(fmt::format("all-reduce #{} could not start", ticket));
      t_->complete(req, "all-reduce", ticket);
      {
        std::lock_guard<std::mutex> l(m_);
        completed_ = ticket + 1;
        stats_.allreduces++;
        stats_.values += static_cast<double>(n);
        stats_.busy_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      cv_.notify_all();
    });
    return ticket;
  }

  void wait(uint64_t ticket) override {
    std::unique_lock<std::mutex> l(m_);
    if (completed_ > ticket) return;
    auto t0 = std::chrono::steady_clock::now();
    // The communication thread's watchdog bounds this wait.
    cv_.wait(l, [&] { return completed_ > ticket; });
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  Stats stats() const override {
    std::lock_guard<std::mutex> l(m_);
    return stats_;
  }

  void broadcast(void* data, size_t bytes, int root) override {
    CS_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "broadcast: {} bytes is too large", bytes);
    t_->run([&] {
      MPI_Request req;
      MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, &req);
      t_->complete(req, "broadcast", serial_++);
    });
  }

  std::vector<std::string> gather(const std::string& bytes, int root) override {
    std::vector<std::string> out;
    t_->run([&] {
      int64_t mine = static_cast<int64_t>(bytes.size());
      std::vector<int64_t> sizes(static_cast<size_t>(size_));
      MPI_Request req;
      MPI_Igather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, root, comm_, &req);
      t_->complete(req, "gather", serial_++);
      std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
      std::string all;
      if (rank_ == root) {
        int64_t total = 0;
        for (int r = 0; r < size_; ++r) {
          if (sizes[r] > INT32_MAX || total + sizes[r] > INT32_MAX)
            t_->die("gather: more than 2 GiB of state to gather");
          counts[r] = static_cast<int>(sizes[r]);
          displs[r] = static_cast<int>(total);
          total += sizes[r];
        }
        all.resize(static_cast<size_t>(total));
      }
      MPI_Igatherv(bytes.data(), static_cast<int>(mine), MPI_BYTE, all.data(), counts.data(),
                   displs.data(), MPI_BYTE, root, comm_, &req);
      t_->complete(req, "gather", serial_++);
      if (rank_ == root)
        for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], counts[r]));
    });
    return out;
  }

  void barrier() override {
    t_->run([&] {
      MPI_Request req;
      MPI_Ibarrier(comm_, &req);
      t_->complete(req, "barrier", serial_++);
    });
  }

  std::shared_ptr<Communicator> first(int n) override {
    CS_CHECK(n >= 1 && n <= size_, "replica group: {} replicas requested of {} processes", n,
             size_);
    if (n == size_) return nullptr;  // the caller keeps this communicator
    MPI_Comm sub = MPI_COMM_NULL;
    t_->run([&] { MPI_Comm_split(comm_, rank_ < n ? 0 : MPI_UNDEFINED, rank_, &sub); });
    if (rank_ >= n) return nullptr;
    return std::make_shared<MpiCommunicator>(t_, sub);
  }

  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    ::signal(SIGTERM, SIG_DFL);  // the caller printed why; no second line as mpirun stops us
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  MpiThread* t_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  bool trace_ = false;  // CSTORCH_TRACE_COLLECTIVES: print every all-reduce as it starts
  std::atomic<uint64_t> issued_{0};
  uint64_t serial_ = 0;  // blocking collectives, for messages (touched on the thread only)
  mutable std::mutex m_;
  std::condition_variable cv_;
  uint64_t completed_ = 0;
  Stats stats_;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_world() {
  // Never destroyed: MPI is finalised by the exit handler, after queued steps have run.
  static MpiThread* thread = [] {
    auto* t = new MpiThread();
    std::atexit([] {
      try {
        cstorch::runtime::synchronize();
      } catch (...) {
        // Reported where it was raised; MPI must still be finalised so the launch ends cleanly.
      }
      thread->shutdown();
    });
    return t;
  }();
  return std::make_shared<MpiCommunicator>(thread, MPI_COMM_WORLD);
}

#endif

}  // namespace cstorch::distributed::detail
