// Multi-replica data parallel: replicas are the processes of an MPI launch
// (`mpirun -np N prog`, or `cszoo fit PARAMS --num_csx N`, which launches them itself). A
// process started without a launcher is a launch of one and needs no MPI at all.
//
// The data-parallel *replica group* is the first `n` processes of the launch (n = the CSX
// backend's cluster_config.num_csx); processes beyond it sit that trainer out. While a group of
// more than one replica is active, every traced step that produces parameter gradients gets a
// gradient all-reduce placed by the compiler (bucketed, started as soon as a bucket's gradients
// exist, waited just before the averaged gradients are first used), weighted by each replica's
// sample count (the leading dimension of the step's first batch input), so uneven splits
// average correctly: g = Σ_r n_r g_r / Σ_r n_r.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "cstorch/backend.h"
#include "cstorch/state.h"
#include "cstorch/tensor.h"

namespace cstorch::distributed {

// `cstorch.distributed.ClusterConfig` of the Python API: the same ClusterConfig.
using ClusterConfig = ::cstorch::ClusterConfig;

// True when an MPI launcher (mpirun) started this process, even as a launch of one. Does not
// initialise MPI.
bool launched_by_mpi();
// Processes of this launch (1 without a launcher) and this process's rank among them. The
// first call initialises MPI when the process was started by mpirun.
int world_size();
int world_rank();
// This process's rank among the launch's processes on its host, from the launcher's environment
// (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK, MPICH's MPI_LOCALRANKID, Slurm's SLURM_LOCALID); 0
// without a launcher. A GPU backend uses GPU:(local rank mod the GPUs there are), so replicas
// launched on one host spread over its GPUs. Does not initialise MPI. Error: a variable that is
// not a non-negative integer (named).
int local_rank();

// Makes the first `n` processes of the launch the replica group. Collective: every process of
// the launch calls it with the same n (the Trainer does, for each trainer it builds). Returns
// whether this process is a member. Errors: n < 1, or n larger than the launch ("... launched
// as 1 process; run `cszoo fit PARAMS --num_csx 2` or `mpirun -np 2 ...`").
bool set_num_replicas(int n);
// The active group: its size (1 when none was set), this process's rank in it (-1 when not a
// member), and whether this process is a member.
int num_replicas();
int replica_rank();
bool is_replica();
// World rank 0: the process that writes checkpoints and logs.
bool is_main_process();

// How replicas combine values.
enum class ReduceOp { Sum, Mean };
// All-reduce over the replica group as graph ops (ops.def: all_reduce_start and
// all_reduce_unpack): traced, they run inside the compiled step; eagerly, at once. Sum: Σ_r x_r;
// Mean: Σ_r w_r x_r / Σ_r w_r with this replica's `weight` (> 0). f32 tensors only (an error
// names the input). One replica: the inputs are returned unchanged. Not differentiable.
std::vector<Tensor> all_reduce(const std::vector<Tensor>& xs, ReduceOp op = ReduceOp::Sum,
                               double weight = 1.0);
Tensor all_reduce(const Tensor& x, ReduceOp op = ReduceOp::Sum, double weight = 1.0);

// Eager collectives over the replica group; each first waits for queued steps.
// Every tensor takes the value it has on replica `root` (same shapes and dtypes everywhere).
void broadcast_(const std::vector<Tensor>& tensors, int root = 0);
// Every replica's `state` on replica `root`, by replica (elsewhere: empty). Tensors travel as
// bytes (dtype and shape kept); any State value works.
std::vector<State> gather_state(const State& state, int root = 0);
void barrier();

// Prints "error: rank R of N: <message>" to stderr and stops every process of the launch
// (MPI_Abort) — a rank that fails must not leave the others waiting in a collective. In a
// launch of one it exits with `code`.
[[noreturn]] void abort(const std::string& message, int code = 1);

// The watchdog of collectives: a collective that has not completed after this many seconds
// (another replica stopped, hangs or died) stops every process of the launch with a message
// naming the limit and, where it can tell, the rank that stopped. set_collective_timeout(s)
// with s > 0 sets it for the collectives that follow (the Trainer passes
// cluster_config.collective_timeout_s); s == 0 returns to the default: the environment variable
// CSTORCH_COLLECTIVE_TIMEOUT_S (seconds), else 300. A set value wins over the environment.
// Errors: s negative or not finite; collective_timeout() errors when the environment variable
// is set but is not a positive number.
void set_collective_timeout(double seconds);
double collective_timeout();

// Input workers of replica `replica` when `num_workers` workers feed `num_replicas` replicas
// round-robin: workers w with w % num_replicas == replica, in order. Fewer workers
// than replicas is an error that says how many are needed.
std::vector<int> workers_of_replica(int num_workers, int num_replicas, int replica);

// The share of a global batch of `global_batch` samples that replica `replica` of
// `num_replicas` takes: global / n, plus one for the first (global % n) replicas. Error when
// global_batch < num_replicas.
int64_t replica_batch_size(int64_t global_batch, int num_replicas, int replica);

// What the active group's communicator measured since it was created: all-reduces, f32 values
// reduced, seconds communicating (start to completion, on the communication thread) and
// seconds the step waited for results (`wait_seconds / busy_seconds` is the share of the
// communication the backward pass did not hide). Zero in a group of one.
struct CommStats {
  int64_t allreduces = 0;
  double values = 0;
  double busy_seconds = 0;
  double wait_seconds = 0;
};
CommStats comm_stats();

// Bytes of gradients per all-reduce bucket (default 4 MiB, or CSTORCH_BUCKET_BYTES). Smaller
// buckets start communicating earlier in the backward pass; larger ones pay less latency.
size_t bucket_bytes();
void set_bucket_bytes(size_t bytes);

}  // namespace cstorch::distributed
