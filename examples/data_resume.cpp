// Restartable data: a training loop over a shuffled, 2-worker DataLoader that saves the
// loader's position from a checkpoint closure and can resume from it in a new process.
//
//   data_resume --max-steps 100                              # the whole run
//   data_resume --max-steps 60 --checkpoint-steps 40 --save-dir ckpt   # saves ckpt/data_39.json
//   data_resume --max-steps 100 --load ckpt/data_39.json     # resumes at step 40
//
// Prints "step S ids i,j,..." for every step (the sample ids of its batch) from a step
// closure, so runs can be compared. The state is stored as JSON here; model checkpoints store
// the same cstorch::State in their files.
#include <cstorch/cstorch.h>
#include <cstorch/data/dataset.h>
#include <CLI/CLI.hpp>
#include <fstream>

namespace cs = cstorch;
namespace data = cstorch::utils::data;
using json = nlohmann::ordered_json;

// State <-> JSON for the scalar/list/map values a loader state holds.
static json to_json(const cs::State& s) {
  switch (s.kind()) {
    case cs::State::Kind::None:
      return nullptr;
    case cs::State::Kind::Bool:
      return s.as_bool();
    case cs::State::Kind::Int:
      return s.as_int();
    case cs::State::Kind::Float:
      return s.as_double();
    case cs::State::Kind::String:
      return s.as_string();
    case cs::State::Kind::List: {
      json j = json::array();
      for (auto& v : s.items()) j.push_back(to_json(v));
      return j;
    }
    case cs::State::Kind::Map: {
      json j = json::object();
      for (auto& k : s.keys()) j[k] = to_json(s.at(k));
      return j;
    }
    case cs::State::Kind::Tensor:
      break;
  }
  cs::fail("data_resume: a tensor in the loader state cannot be written as JSON");
}
static cs::State from_json(const json& j) {
  if (j.is_null()) return cs::State();
  if (j.is_boolean()) return cs::State(j.get<bool>());
  if (j.is_number_integer()) return cs::State(j.get<int64_t>());
  if (j.is_number()) return cs::State(j.get<double>());
  if (j.is_string()) return cs::State(j.get<std::string>());
  if (j.is_array()) {
    cs::State l = cs::State::list();
    for (auto& v : j) l.push_back(from_json(v));
    return l;
  }
  cs::State m = cs::State::map();
  for (auto& [k, v] : j.items()) m.set(k, from_json(v));
  return m;
}

int main(int argc, char** argv) {
  CLI::App app{"Resumable data loading with cstorch's DataLoader and DataExecutor"};
  int64_t max_steps = 100, checkpoint_steps = 0, samples = 150, batch = 4;
  int workers = 2, lookahead = 4;
  std::string save_dir, load;
  app.add_option("--max-steps", max_steps, "Last step + 1 of the run");
  app.add_option("--checkpoint-steps", checkpoint_steps, "Save the data position every N steps");
  app.add_option("--save-dir", save_dir, "Folder for data_<step>.json");
  app.add_option("--load", load, "Resume from a saved data_<step>.json");
  app.add_option("--samples", samples, "Samples in the synthetic data set");
  app.add_option("--batch-size", batch, "Batch size");
  app.add_option("--workers", workers, "DataLoader worker threads");
  app.add_option("--lookahead", lookahead, "Steps the client may run ahead of the executor");
  CLI11_PARSE(app, argc, argv);
  try {
    cs::set_lookahead(lookahead);
    int64_t initial_step = 0;
    json saved;
    if (!load.empty()) {
      std::ifstream in(load);
      if (!in) cs::fail("data_resume: cannot open '{}'", load);
      saved = json::parse(in);
      initial_step = saved.at("step").get<int64_t>() + 1;
    }
    // Each worker shuffles the whole id set with the same seed and takes its shard.
    auto input_fn = [](const cs::Config& a, const data::WorkerInfo& w) {
      int64_t n = a.at("samples").get<int64_t>();
      std::vector<int64_t> ids(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
      auto ds = std::make_shared<cs::data::TensorDataset>(cs::Batch{
          {"id", cs::from_vector(ids, {n})}, {"x", cs::from_vector(ids, {n}).to(cs::DType::f32)}});
      cs::data::LoaderOptions o;
      o.batch_size = a.at("batch_size").get<int64_t>();
      o.shuffle = true;
      o.seed = 3;
      o.worker = w;
      return std::static_pointer_cast<data::Loader>(
          std::make_shared<cs::data::DatasetLoader>(ds, o));
    };
    data::DataLoader loader(input_fn, {{"samples", samples},
                                       {"batch_size", batch},
                                       {"num_workers", workers},
                                       {"max_steps", max_steps},
                                       {"initial_step", initial_step}});
    if (!load.empty()) loader.load_state_dict(from_json(saved.at("data")));

    cs::Tensor total = cs::zeros({});
    auto step = cs::trace([&](const cs::Batch& b) {
      total.add_(cs::sum(b.at("x")));
      return b.at("id") * 1.0;  // the ids (i64), as a step output
    });
    auto print = cs::step_closure([](const cs::Tensor& ids, int64_t s) {
      auto v = ids.to_vector<int64_t>();
      fmt::print("step {} ids {}\n", s, fmt::join(v, ","));
    });
    auto save = cs::checkpoint_closure([&](int64_t s) {
      // Runs after step s; the client may already have taken later batches.
      json j{{"step", s}, {"data", to_json(loader.state_dict())}};
      std::ofstream(save_dir + "/data_" + std::to_string(s) + ".json") << j.dump() << "\n";
    });
    data::DataExecutor executor(loader, {.checkpoint_steps = checkpoint_steps});
    for (const auto& b : executor) {
      auto ids = step(b);
      print(ids, executor.step());
      if (!save_dir.empty() && executor.is_checkpoint_step(executor.step())) save(executor.step());
    }
    fmt::print("ran steps {}..{}; waited {:.3f} s for data\n", executor.initial_step(),
               executor.last_step(), executor.data_wait_seconds());
  } catch (const cs::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
