// The communicator interface behind multi-replica data parallel: the collectives a replica
// group needs (a nonblocking in-place sum all-reduce of f32 buckets, broadcast, gather of
// byte strings, barrier, abort). `LocalCommunicator` is the one-process group; the MPI
// implementation (mpi_communicator.cpp) drives Open MPI from one communication thread. An NCCL
// implementation would implement the same interface with CUDA streams in place of the thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cstorch/distributed.h"

namespace cstorch::distributed::detail {

// What a communicator measured (the public CommStats: all-reduces started, f32 values reduced,
// seconds communicating, seconds callers were blocked in wait()).
using Stats = CommStats;

class Communicator {
 public:
  virtual Stats stats() const { return {}; }
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* kind() const = 0;  // "local", "mpi"

  // Starts an element-wise sum of `n` f32 values in place over every rank of the group and
  // returns a ticket. The buffer must not be read or written until wait(ticket) returns.
  // Tickets complete in the order they were issued; every rank issues the same sequence of
  // collectives (they come from the same compiled program and the same Trainer code).
  virtual uint64_t start_allreduce(float* data, size_t n) = 0;
  // Waits for a ticket (and every earlier one). A collective that does not complete within
  // the watchdog time stops every rank with a message naming this rank.
  virtual void wait(uint64_t ticket) = 0;

  // Blocking collectives.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // On `root`: every rank's bytes, by rank; elsewhere: empty.
  virtual std::vector<std::string> gather(const std::string& bytes, int root) = 0;
  virtual void barrier() = 0;
  // The group of the first `n` ranks (collective: every rank calls it); null on ranks >= n.
  virtual std::shared_ptr<Communicator> first(int n) = 0;
  // Stops every rank of the launch now (after the caller printed why).
  [[noreturn]] virtual void abort(int code) = 0;
};

// One process: every collective is the identity.
class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* kind() const override { return "local"; }
  uint64_t start_allreduce(float*, size_t) override { return next_++; }
  void wait(uint64_t) override {}
  void broadcast(void*, size_t, int) override {}
  std::vector<std::string> gather(const std::string& bytes, int) override { return {bytes}; }
  void barrier() override {}
  std::shared_ptr<Communicator> first(int n) override;
  [[noreturn]] void abort(int code) override;

 private:
  uint64_t next_ = 0;
};

// The watchdog limit when neither set_collective_timeout nor CSTORCH_COLLECTIVE_TIMEOUT_S
// sets one.
constexpr double kDefaultCollectiveTimeout = 300.0;
// CSTORCH_COLLECTIVE_TIMEOUT_S, else the default (read once; an error when it is not a
// positive number).
double env_collective_timeout();
// Where collective_timeout() comes from, for messages: "cluster_config.collective_timeout_s",
// "CSTORCH_COLLECTIVE_TIMEOUT_S" or "the default".
std::string collective_timeout_origin();

// True when this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE,
// Hydra sets PMI_SIZE); its world size, else 1.
int launched_world_size();
// This process's rank as the launcher set it (OMPI_COMM_WORLD_RANK, PMI_RANK), else 0: names
// the rank in messages when MPI could not be initialised.
int launched_world_rank();
// The world communicator of an MPI launch (initialises MPI on first use); an error when this
// build has no MPI.
std::shared_ptr<Communicator> make_mpi_world();

}  // namespace cstorch::distributed::detail
