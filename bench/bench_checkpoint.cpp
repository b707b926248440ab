// Checkpoint benchmark (bench/run case "checkpoint"): save (including fsync) and load of a
// GPT-2-small-shaped state dict (~500 MB of f32), and reading one named tensor with
// CheckpointReader. "Cold" loads first evict the file from the page cache
// (posix_fadvise DONTNEED after fsync), so they read from the disk as a restarted job would.
// Prints one JSON line with the per-repeat seconds.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"

namespace cs = cstorch;

// GPT-2 small (124M parameters): the shapes of its state dict.
cs::State gpt2_state(int64_t* bytes) {
  std::vector<std::pair<std::string, cs::Shape>> shapes = {{"wte.weight", {50257, 768}},
                                                           {"wpe.weight", {1024, 768}}};
  for (int l = 0; l < 12; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    shapes.push_back({p + "ln_1.weight", {768}});
    shapes.push_back({p + "ln_1.bias", {768}});
    shapes.push_back({p + "attn.c_attn.weight", {768, 2304}});
    shapes.push_back({p + "attn.c_attn.bias", {2304}});
    shapes.push_back({p + "attn.c_proj.weight", {768, 768}});
    shapes.push_back({p + "attn.c_proj.bias", {768}});
    shapes.push_back({p + "ln_2.weight", {768}});
    shapes.push_back({p + "ln_2.bias", {768}});
    shapes.push_back({p + "mlp.c_fc.weight", {768, 3072}});
    shapes.push_back({p + "mlp.c_fc.bias", {3072}});
    shapes.push_back({p + "mlp.c_proj.weight", {3072, 768}});
    shapes.push_back({p + "mlp.c_proj.bias", {768}});
  }
  shapes.push_back({"ln_f.weight", {768}});
  shapes.push_back({"ln_f.bias", {768}});
  cs::State model = cs::State::map();
  uint32_t s = 12345;
  *bytes = 0;
  for (auto& [k, shape] : shapes) {
    std::vector<float> v(static_cast<size_t>(cs::numel(shape)));
    for (auto& x : v) {
      s = s * 1664525u + 1013904223u;
      x = static_cast<float>(s >> 8) * 0x1p-24f - 0.5f;
    }
    model.set(k, cs::from_vector(v, shape));
    *bytes += static_cast<int64_t>(v.size() * 4);
  }
  return model;
}

void evict(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

template <class F>
double timed(F f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int main(int argc, char** argv) {
  CLI::App app{"cstorch checkpoint benchmark"};
  std::string dir, one = "h.5.attn.c_proj.weight", ext = "mdl";
  int repeats = 3;
  bool keep = false;
  app.add_option("--dir", dir, "Folder for the files")->required();
  app.add_option("--repeats", repeats, "Timed repeats");
  app.add_option("--tensor", one, "The one tensor to read");
  app.add_flag("--keep", keep, "Keep the checkpoint file");
  app.add_option("--ext", ext, "File extension, which picks the format (mdl, pt, safetensors)");
  CLI11_PARSE(app, argc, argv);
  int64_t bytes = 0;
  cs::State state = gpt2_state(&bytes);
  std::string path = dir + "/cstorch." + ext;
  nlohmann::json out{{"bytes", bytes}, {"tensors", state.size()}, {"one", one}};
  std::vector<double> save, load_cold, load_warm, one_cold, one_warm;
  for (int r = 0; r < repeats; ++r) {
    save.push_back(timed([&] { cs::save(state, path); }));
    evict(path);
    load_cold.push_back(timed([&] { cs::State s = cs::load(path); }));
    load_warm.push_back(timed([&] { cs::State s = cs::load(path); }));
    evict(path);
    int64_t got = 0;
    one_cold.push_back(timed([&] {
      cs::CheckpointReader rd(path);
      got = rd.read(one).numel();
    }));
    one_warm.push_back(timed([&] {
      cs::CheckpointReader rd(path);
      got = rd.read(one).numel();
    }));
    if (got != 768 * 768 && one == "h.5.attn.c_proj.weight") return 1;
  }
  out["file_bytes"] = static_cast<int64_t>(std::filesystem::file_size(path));
  out["save"] = save;
  out["load_cold"] = load_cold;
  out["load_warm"] = load_warm;
  out["one_cold"] = one_cold;
  out["one_warm"] = one_warm;
  std::printf("%s\n", out.dump().c_str());
  if (!keep) std::remove(path.c_str());
  return 0;
}
