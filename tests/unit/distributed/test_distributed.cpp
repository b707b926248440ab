// Multi-replica pieces that need no launch: worker assignment, batch splitting, a DataLoader
// feeding one replica of several, the one-process group, CSX cluster_config validation. The
// MPI launches themselves are tested end to end (tests/e2e/test_distributed.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>

#include "cstorch/cstorch.h"
#include "cstorch/distributed.h"

namespace cs = cstorch;
namespace dist = cstorch::distributed;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cs::Error& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST(Distributed, WorkersAreAssignedToReplicasRoundRobin) {
  // Two workers, two replicas: one each; three workers: the third goes to replica 0.
  EXPECT_EQ(dist::workers_of_replica(2, 2, 0), (std::vector<int>{0}));
  EXPECT_EQ(dist::workers_of_replica(2, 2, 1), (std::vector<int>{1}));
  EXPECT_EQ(dist::workers_of_replica(3, 2, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(dist::workers_of_replica(3, 2, 1), (std::vector<int>{1}));
  EXPECT_EQ(dist::workers_of_replica(8, 3, 2), (std::vector<int>{2, 5}));
  EXPECT_EQ(error_of([] { dist::workers_of_replica(3, 4, 0); }),
            "DataLoader: 4 replicas need at least 4 input workers (one per replica), got 3; set "
            "cluster_config.num_workers_per_csx >= 1 or the loader's num_workers >= 4");
  EXPECT_NE(error_of([] { dist::workers_of_replica(3, 2, 2); }).find("replica 2 is not in 0..1"),
            std::string::npos);
}

TEST(Distributed, TheGlobalBatchIsSplitAcrossReplicas) {
  EXPECT_EQ(dist::replica_batch_size(32, 2, 0), 16);
  EXPECT_EQ(dist::replica_batch_size(7, 3, 0), 3);
  EXPECT_EQ(dist::replica_batch_size(7, 3, 1), 2);
  EXPECT_EQ(dist::replica_batch_size(7, 3, 2), 2);
  EXPECT_EQ(error_of([] { dist::replica_batch_size(1, 2, 0); }),
            "batch_size 1 cannot be split across 2 replicas (each needs at least one sample)");
}

// A DataLoader for replica 1 of 2 with 3 workers runs worker 1 of 3 only, with half the batch.
TEST(Distributed, DataLoaderFeedsItsReplicaFromItsWorkers) {
  std::mutex m;
  std::vector<std::pair<int, int>> seen;
  int64_t batch = -1;
  auto fn = [&](const cs::Config& args, const cs::utils::data::WorkerInfo& w) {
    std::lock_guard<std::mutex> l(m);
    seen.push_back({w.id, w.num_workers});
    batch = args.at("batch_size").get<int64_t>();
    auto x = cs::arange(0, 30, 1, cs::DType::f32).reshape({30, 1});
    return std::make_shared<cs::utils::data::TensorLoader>(cs::Batch{{"x", x}}, batch, false, 0,
                                                           false, w);
  };
  cs::utils::data::DataLoader loader(
      fn, {{"batch_size", 9}, {"num_workers", 3}, {"num_replicas", 2}, {"replica", 1}});
  EXPECT_EQ(loader.num_workers(), 1);
  EXPECT_EQ(loader.total_workers(), 3);
  EXPECT_EQ(loader.worker_ids(), (std::vector<int>{1}));
  auto b = loader.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(seen, (std::vector<std::pair<int, int>>{{1, 3}}));
  EXPECT_EQ(batch, 4);  // 9 = 5 + 4
  // Worker 1 of 3 takes rows 1, 4, 7, ...
  EXPECT_EQ(b->at("x").to_vector<float>(), (std::vector<float>{1, 4, 7, 10}));
  EXPECT_NE(
      error_of([&] {
        cs::utils::data::DataLoader l2(
            fn, {{"batch_size", 9}, {"num_workers", 1}, {"num_replicas", 2}, {"replica", 0}});
      })
          .find("2 replicas need at least 2 input workers (one per replica), got 1; the "
                "loader's num_workers is the workers of all replicas together: set it to 2 or "
                "more, or leave it out"),
      std::string::npos);
  // Without num_workers (a ported config's num_workers: 0 leaves it out): one worker a replica.
  cs::utils::data::DataLoader l3(fn, {{"batch_size", 9}, {"num_replicas", 2}, {"replica", 1}});
  EXPECT_EQ(l3.num_workers(), 1);
}

TEST(Distributed, OneProcessIsAGroupOfOne) {
  EXPECT_FALSE(dist::launched_by_mpi());
  EXPECT_EQ(dist::world_size(), 1);
  EXPECT_EQ(dist::world_rank(), 0);
  EXPECT_TRUE(dist::set_num_replicas(1));
  EXPECT_EQ(dist::num_replicas(), 1);
  EXPECT_EQ(dist::replica_rank(), 0);
  auto x = cs::full({3}, 2.5);
  EXPECT_EQ(dist::all_reduce(x, dist::ReduceOp::Mean, 3.0).to_vector<float>(),
            x.to_vector<float>());
  auto all = dist::gather_state(cs::State::map({{"a", 1}, {"t", cs::ones({2})}}));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].at("a").as_int(), 1);
  EXPECT_EQ(all[0].at("t").as_tensor().to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(error_of([] { dist::set_num_replicas(2); }),
            "cluster_config.num_csx is 2 but this run was launched as 1 process: launch it with "
            "`cszoo fit PARAMS --num_csx 2` (or `mpirun -np 2 cszoo fit PARAMS --multireplica`)");
  EXPECT_NE(error_of([] {
              dist::all_reduce(cs::ones({2}, cs::DType::i64));
            }).find("all_reduce: tensor 0 is i64; only f32 is supported"),
            std::string::npos);
}

// The rank on this host comes from the launcher's environment (what picks a replica's GPU).
TEST(Distributed, LocalRankComesFromTheLaunchersEnvironment) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    ::unsetenv(v);
  EXPECT_EQ(dist::local_rank(), 0);
  ::setenv("SLURM_LOCALID", "2", 1);
  EXPECT_EQ(dist::local_rank(), 2);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "5", 1);  // Open MPI's, when both are set
  EXPECT_EQ(dist::local_rank(), 5);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "-1", 1);
  EXPECT_EQ(error_of([] { dist::local_rank(); }),
            "OMPI_COMM_WORLD_LOCAL_RANK='-1': a local rank must be a non-negative integer");
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  ::unsetenv("SLURM_LOCALID");
}

TEST(Distributed, CsxClusterConfigFieldsAreValidated) {
  auto err = [](auto edit) {
    cs::BackendOptions o;
    edit(o.cluster_config);
    return error_of([&] { cs::Backend(cs::DeviceType::CSX, o); });
  };
  EXPECT_EQ(err([](cs::ClusterConfig& c) { c.num_csx = 0; }),
            "cluster_config.num_csx must be at least 1, got 0");
  EXPECT_EQ(err([](cs::ClusterConfig& c) { c.mount_dirs = {"/nonexistent/cstorch_mount"}; }),
            "cluster_config.mount_dirs: '/nonexistent/cstorch_mount' does not exist or is not a "
            "directory");
  EXPECT_EQ(err([](cs::ClusterConfig& c) {
              c.job_labels = {"team=ml", "bad label=x"};
            }),
            "cluster_config.job_labels: 'bad label=x': key and value must be 1 to 63 characters "
            "of letters, digits, '.', '_' or '-', starting and ending with a letter or digit");
  EXPECT_EQ(err([](cs::ClusterConfig& c) { c.job_labels = {"novalue"}; }),
            "cluster_config.job_labels: 'novalue' is not of the form key=value");
  EXPECT_EQ(err([](cs::ClusterConfig& c) { c.transfer_processes = 0; }),
            "cluster_config.transfer_processes must be at least 1, got 0");
  EXPECT_EQ(err([](cs::ClusterConfig& c) { c.max_wgt_servers = -1; }),
            "cluster_config.max_wgt_servers must be >= 0, got -1");
  EXPECT_EQ(err([](cs::ClusterConfig& c) { c.collective_timeout_s = -2; }),
            "cluster_config.collective_timeout_s must be a positive number of seconds (0: the "
            "default), got -2");
  EXPECT_EQ(err([](cs::ClusterConfig& c) { c.collective_timeout_s = NAN; }),
            "cluster_config.collective_timeout_s must be a positive number of seconds (0: the "
            "default), got nan");
  // Valid: an existing mount dir and well-formed labels.
  EXPECT_EQ(err([](cs::ClusterConfig& c) {
              c.mount_dirs = {std::filesystem::temp_directory_path().string()};
              c.job_labels = {"team=ml", "run.id=a-1_b"};
            }),
            "(no error)");
}

// The collectives' watchdog limit: a set value wins over CSTORCH_COLLECTIVE_TIMEOUT_S, 0 returns
// to the environment's value (here unset: the 300 s default); negative is an error.
TEST(Distributed, CollectiveTimeoutIsSetOrTheDefault) {
  ASSERT_EQ(std::getenv("CSTORCH_COLLECTIVE_TIMEOUT_S"), nullptr);
  EXPECT_EQ(dist::collective_timeout(), 300.0);
  dist::set_collective_timeout(2.5);
  EXPECT_EQ(dist::collective_timeout(), 2.5);
  dist::set_collective_timeout(0);
  EXPECT_EQ(dist::collective_timeout(), 300.0);
  EXPECT_EQ(error_of([] { dist::set_collective_timeout(-1); }),
            "set_collective_timeout: -1 is not a number of seconds >= 0 (0: the default)");
  EXPECT_EQ(dist::collective_timeout(), 300.0);
}
