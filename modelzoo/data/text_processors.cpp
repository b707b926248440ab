// Data processors of the transformer models: "GptHDF5DataProcessor",
// "GptFlatTokenDataProcessor", "BertDataProcessor", "T5DataProcessor" and
// "TransformerDataProcessor" (keys and file layouts: docs/data.md). With `synthetic: true` (the
// default) a data_dir without the split's files first gets the embedded synthetic corpus
// (cstorch/data/text.h) written for the train and val splits.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/ranges.h>

#include "cstorch/data/dataset.h"
#include "cstorch/data/text.h"
#include "modelzoo/config_view.h"
#include "modelzoo/data/loader_args.h"
#include "modelzoo/model.h"

namespace modelzoo {
namespace {

namespace cs = cstorch;
namespace fs = std::filesystem;
using cs::data::LoaderOptions;

const std::vector<std::string> kCommonKeys = {
    "data_processor",      "data_dir",  "split",       "batch_size", "shuffle",
    "shuffle_seed",        "drop_last", "num_workers", "prefetch",   "synthetic",
    "max_sequence_length", "vocab_size"};

std::vector<std::string> keys(std::vector<std::string> extra) {
  extra.insert(extra.begin(), kCommonKeys.begin(), kCommonKeys.end());
  return extra;
}

struct Common {
  std::string dir, split;
  bool synthetic;
  LoaderOptions loader;  // batch_size: the global batch; each input_fn reads its share
  cs::Config args;       // batch_size, num_workers, prefetch for the DataLoader
};

Common common(const ConfigView& a, const std::string& default_dir) {
  Common c;
  c.dir = a.get_string("data_dir", default_dir);
  c.split = a.get_string("split", "train");
  c.synthetic = a.get_bool("synthetic", true);
  int64_t batch = a.at("batch_size").as_int();
  if (batch < 1) cs::fail("{}: must be at least 1, got {}", a.child_path("batch_size"), batch);
  bool train = c.split == "train";
  c.loader.batch_size = batch;
  c.loader.shuffle = a.get_bool("shuffle", train);
  c.loader.seed = static_cast<uint64_t>(a.get_int("shuffle_seed", 0));
  c.loader.drop_last = a.get_bool("drop_last", train);
  // The DataLoader splits the global batch across the replicas and passes each input_fn its
  // replica's share as args["batch_size"] (options()).
  c.args = {{"batch_size", batch}};
  detail::add_loader_args(a, c.args);
  return c;
}

int64_t positive(const ConfigView& a, const std::string& key, std::optional<int64_t> def) {
  int64_t v = def && !a.has(key) ? *def : a.at(key).as_int();
  if (v < 1) cs::fail("{}: must be at least 1, got {}", a.child_path(key), v);
  return v;
}

cs::data::TokenType token_type(const ConfigView& a) {
  std::string t = a.get_string("token_dtype", "uint16");
  if (t == "uint16") return cs::data::TokenType::u16;
  if (t == "int32") return cs::data::TokenType::i32;
  if (t == "uint32") return cs::data::TokenType::u32;
  if (t == "int64") return cs::data::TokenType::i64;
  cs::fail("{}: must be uint16, int32, uint32 or int64, got '{}'", a.child_path("token_dtype"), t);
}

bool is_h5_name(const fs::path& p) {
  const auto ext = p.extension().string();
  return ext == ".h5" || ext == ".hdf5";
}

bool has_h5(const fs::path& dir) {
  if (!fs::is_directory(dir)) return false;
  for (auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && is_h5_name(e.path())) return true;
  return false;
}

// The files of a synthetic corpus's layout that `dir` holds already, by their names in it: of
// both splits, `suffixes` (".bin" names train.bin and val.bin) and, with `h5_dirs`, every HDF5
// file in train/ and val/.
struct Layout {
  std::vector<std::string> suffixes;
  bool h5_dirs = false;
};
std::vector<std::string> layout_files(const fs::path& dir, const Layout& l) {
  std::vector<std::string> r;
  std::error_code ec;
  for (const std::string split : {"train", "val"}) {
    for (const auto& s : l.suffixes)
      if (fs::exists(dir / (split + s), ec)) r.push_back(split + s);
    if (l.h5_dirs && fs::is_directory(dir / split, ec))
      for (auto& e : fs::directory_iterator(dir / split, ec))
        if (is_h5_name(e.path())) r.push_back(split + "/" + e.path().filename().string());
  }
  std::sort(r.begin(), r.end());
  return r;
}

// Writes the synthetic data with `write` when `present()` is false: once, whichever processes
// (replicas, separate runs) or processors name the same folder at the same time. Only into a
// folder that holds none of the corpus's files (`layout`): the writers write both splits, and
// wrote over a user's files there (a train.src without its train.tgt) or beside them (a user's
// train/*.h5 then read with the synthetic train/data_0.h5 when the val split was missing).
template <class Present, class Write>
void ensure(const Common& c, const ConfigView& a, const char* what, const Layout& layout,
            Present present, Write write) {
  cs::data::write_once(c.dir, present, [&] {
    if (c.synthetic && (c.split == "train" || c.split == "val")) {
      const auto there = layout_files(c.dir, layout);
      if (!there.empty())
        cs::fail(
            "{}: '{}' has no {} files for split '{}' but holds {}: the synthetic corpus is "
            "written only into a folder without any of its files (it would write over them or "
            "mix with them). Give the split's files (docs/data.md lists them), point data_dir "
            "at another folder, or remove these (an interrupted synthetic write?)",
            a.child_path("data_dir"), c.dir, what, c.split, fmt::join(there, ", "));
    }
    if (!c.synthetic)
      cs::fail(
          "{}: no {} files for split '{}' in '{}' (set synthetic: true to generate the "
          "embedded corpus)",
          a.child_path("data_dir"), what, c.split, c.dir);
    if (c.split != "train" && c.split != "val")
      cs::fail(
          "{}: no files for split '{}' in '{}'; the synthetic corpus has only the splits train "
          "and val",
          a.child_path("split"), c.split, c.dir);
    fmt::print("no {} files in {}: writing the synthetic corpus\n", what, c.dir);
    std::fflush(stdout);
    write();
  });
}

// The loader options of one input_fn call: this replica's batch size, this worker.
LoaderOptions options(LoaderOptions o, const cs::Config& args,
                      const cs::utils::data::WorkerInfo& w) {
  o.batch_size = args.at("batch_size").get<int64_t>();
  o.worker = w;
  return o;
}

DataLoaderPtr loader(const Common& c, cs::utils::data::InputFn fn) {
  return std::make_shared<cs::utils::data::DataLoader>(std::move(fn), c.args);
}

MODELZOO_REGISTER(data_processors, "GptHDF5DataProcessor",
                  [](const ConfigView& a) -> DataLoaderPtr {
                    a.check_keys(keys({}));
                    Common c = common(a, "data/gpt2");
                    int64_t msl = positive(a, "max_sequence_length", 128);
                    int64_t vocab = detail::optional_vocab_size(a);
                    fs::path dir = fs::path(c.dir) / c.split;
                    ensure(
                        c, a, "GPT HDF5", Layout{{".bin"}, true}, [&] { return has_h5(dir); },
                        [&] { cs::data::write_synthetic_gpt_data(c.dir, msl); });
                    cs::data::GptDataOptions d{.hdf5_files = {dir.string()},
                                               .max_sequence_length = msl,
                                               .vocab_size = vocab};
                    return loader(c, [d, o = c.loader](const cs::Config& args,
                                                       const cs::utils::data::WorkerInfo& w) {
                      return cs::data::make_gpt_loader(d, options(o, args, w));
                    });
                  });

MODELZOO_REGISTER(data_processors, "GptFlatTokenDataProcessor",
                  [](const ConfigView& a) -> DataLoaderPtr {
                    a.check_keys(keys({"token_dtype"}));
                    Common c = common(a, "data/gpt2");
                    int64_t msl = positive(a, "max_sequence_length", 128);
                    int64_t vocab = detail::optional_vocab_size(a);
                    fs::path file = fs::path(c.dir) / (c.split + ".bin");
                    ensure(
                        c, a, "flat token", Layout{{".bin"}, true},
                        [&] { return fs::exists(file); },
                        [&] { cs::data::write_synthetic_gpt_data(c.dir, msl); });
                    cs::data::GptDataOptions d{.flat_file = file.string(),
                                               .token_type = token_type(a),
                                               .max_sequence_length = msl,
                                               .vocab_size = vocab};
                    return loader(c, [d, o = c.loader](const cs::Config& args,
                                                       const cs::utils::data::WorkerInfo& w) {
                      return cs::data::make_gpt_loader(d, options(o, args, w));
                    });
                  });

MODELZOO_REGISTER(data_processors, "BertDataProcessor", [](const ConfigView& a) -> DataLoaderPtr {
  a.check_keys(keys({"mlm_probability", "mask_seed"}));
  Common c = common(a, "data/bert");
  int64_t msl = positive(a, "max_sequence_length", 128);
  int64_t vocab = positive(a, "vocab_size", std::nullopt);
  double p = a.get_double("mlm_probability", 0.15);
  if (!(p > 0 && p < 1))
    cs::fail("{}: must be in (0, 1), got {}", a.child_path("mlm_probability"), p);
  fs::path dir = fs::path(c.dir) / c.split;
  ensure(
      c, a, "BERT", Layout{{}, true}, [&] { return has_h5(dir); },
      [&] { cs::data::write_synthetic_bert_data(c.dir, msl); });
  cs::data::BertDataOptions d{.files = {dir.string()},
                              .max_sequence_length = msl,
                              .vocab_size = vocab,
                              .mlm_probability = p,
                              .mask_seed = static_cast<uint64_t>(a.get_int("mask_seed", 0))};
  return loader(c, [d, o = c.loader](const cs::Config& args, const cs::utils::data::WorkerInfo& w) {
    return cs::data::make_bert_loader(d, options(o, args, w));
  });
});

MODELZOO_REGISTER(data_processors, "T5DataProcessor", [](const ConfigView& a) -> DataLoaderPtr {
  a.check_keys(
      keys({"token_dtype", "extra_ids", "max_target_length", "noise_density",
            "mean_noise_span_length", "noise_seed", "eos_id", "pad_id", "decoder_start_id"}));
  Common c = common(a, "data/t5");
  cs::data::T5DataOptions d;
  d.max_sequence_length = positive(a, "max_sequence_length", 128);
  d.vocab_size = positive(a, "vocab_size", std::nullopt);
  d.extra_ids = positive(a, "extra_ids", 100);
  d.max_target_length = a.get_int("max_target_length", 0);
  d.noise_density = a.get_double("noise_density", 0.15);
  d.mean_noise_span_length = a.get_double("mean_noise_span_length", 3.0);
  d.noise_seed = static_cast<uint64_t>(a.get_int("noise_seed", 0));
  d.eos_id = a.get_int("eos_id", d.eos_id);
  d.pad_id = a.get_int("pad_id", d.pad_id);
  d.decoder_start_id = a.get_int("decoder_start_id", d.decoder_start_id);
  d.token_type = token_type(a);
  if (!(d.noise_density > 0 && d.noise_density < 1))
    cs::fail("{}: must be in (0, 1), got {}", a.child_path("noise_density"), d.noise_density);
  if (!(d.mean_noise_span_length >= 1))
    cs::fail("{}: must be at least 1, got {}", a.child_path("mean_noise_span_length"),
             d.mean_noise_span_length);
  auto [tokens, targets] =
      cs::data::t5_span_lengths(d.max_sequence_length, d.noise_density, d.mean_noise_span_length);
  if (d.max_target_length != 0 && d.max_target_length < targets)
    cs::fail(
        "{}: {} is shorter than the {} target tokens span corruption makes from "
        "max_sequence_length {} ({} raw tokens); the encoder and decoder lengths do not match",
        a.child_path("max_target_length"), d.max_target_length, targets, d.max_sequence_length,
        tokens);
  fs::path file = fs::path(c.dir) / (c.split + ".bin");
  ensure(
      c, a, "T5 token", Layout{{".bin"}, false}, [&] { return fs::exists(file); },
      [&] { cs::data::write_synthetic_t5_data(c.dir); });
  d.file = file.string();
  return loader(c, [d, o = c.loader](const cs::Config& args, const cs::utils::data::WorkerInfo& w) {
    return cs::data::make_t5_loader(d, options(o, args, w));
  });
});

MODELZOO_REGISTER(data_processors, "TransformerDataProcessor",
                  [](const ConfigView& a) -> DataLoaderPtr {
                    a.check_keys(keys({"max_target_length", "eos_id", "pad_id", "start_id"}));
                    Common c = common(a, "data/transformer");
                    cs::data::ParallelDataOptions d;
                    d.max_sequence_length = positive(a, "max_sequence_length", 64);
                    d.max_target_length = positive(a, "max_target_length", d.max_sequence_length);
                    d.vocab_size = positive(a, "vocab_size", std::nullopt);
                    d.eos_id = a.get_int("eos_id", d.eos_id);
                    d.pad_id = a.get_int("pad_id", d.pad_id);
                    d.start_id = a.get_int("start_id", d.start_id);
                    fs::path base = fs::path(c.dir) / c.split;
                    d.source_file = base.string() + ".src";
                    d.target_file = base.string() + ".tgt";
                    ensure(
                        c, a, "translation", Layout{{".src", ".tgt"}, false},
                        [&] { return fs::exists(d.source_file) && fs::exists(d.target_file); },
                        [&] { cs::data::write_synthetic_translation_data(c.dir); });
                    auto corpus = cs::data::load_parallel_corpus(d);
                    return loader(c, [corpus, o = c.loader](const cs::Config& args,
                                                            const cs::utils::data::WorkerInfo& w) {
                      return cs::data::make_parallel_loader(corpus, options(o, args, w));
                    });
                  });

}  // namespace
}  // namespace modelzoo
