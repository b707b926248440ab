// Data processors for data a user brings, configured in YAML alone (keys and examples:
// docs/your-own-data.md):
//  * "CSVDataProcessor": delimited text files, feature and label columns by name or index;
//  * "NumpyDataProcessor": .npy files, or arrays of a .npz archive, by name;
//  * "HDF5DataProcessor": datasets of HDF5 files by name;
//  * "JSONLTextDataProcessor": JSON Lines documents tokenized with a BPE vocabulary and cut into
//    GPT-style sequences (the batches GptFlatTokenDataProcessor makes).
// The arrays are read once when the processor is built; every DataLoader worker (and replica)
// then batches its shard of them (epoch_indices: seeded shuffle, worker w takes every
// num_workers-th sample), as the other processors do.
#include <filesystem>

#include <fmt/ranges.h>

#include "cstorch/data/arrays.h"
#include "cstorch/data/dataset.h"
#include "cstorch/data/text.h"
#include "cstorch/data/tokenizer.h"
#include "modelzoo/config_view.h"
#include "modelzoo/data/loader_args.h"
#include "modelzoo/model.h"

namespace modelzoo {
namespace {

namespace cs = cstorch;
namespace fs = std::filesystem;
using cs::data::LoaderOptions;

const std::vector<std::string> kLoaderKeys = {"data_processor", "data_dir",     "batch_size",
                                              "shuffle",        "shuffle_seed", "drop_last",
                                              "num_workers",    "prefetch"};

std::vector<std::string> keys(std::vector<std::string> extra) {
  extra.insert(extra.begin(), kLoaderKeys.begin(), kLoaderKeys.end());
  return extra;
}

struct Loading {
  std::string dir;       // base of relative paths ("" = the working directory)
  LoaderOptions loader;  // batch_size: the global batch; each input_fn reads its share
  cs::Config args;       // batch_size, num_workers, prefetch for the DataLoader
};

Loading loading(const ConfigView& a) {
  Loading l;
  l.dir = a.get_string("data_dir", "");
  int64_t batch = a.at("batch_size").as_int();
  if (batch < 1) cs::fail("{}: must be at least 1, got {}", a.child_path("batch_size"), batch);
  l.loader.batch_size = batch;
  // Shuffled by default: these processors have no split to tell a training set from another.
  l.loader.shuffle = a.get_bool("shuffle", true);
  l.loader.seed = static_cast<uint64_t>(a.get_int("shuffle_seed", 0));
  l.loader.drop_last = a.get_bool("drop_last", false);
  // The DataLoader splits the global batch across the replicas and passes each input_fn its
  // replica's share as args["batch_size"].
  l.args = {{"batch_size", batch}};
  detail::add_loader_args(a, l.args);
  return l;
}

// `p` relative to data_dir when it is relative and data_dir is given.
std::string resolve(const Loading& l, const std::string& p) {
  if (l.dir.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(l.dir) / p).string();
}

// Fails at `v` unless `p` (resolved) exists and is not a folder; a relative path says where it
// was looked for (a config run from another folder than the one its data paths assume is the
// usual cause). A folder is refused here because each reader would otherwise fail on it in its
// own words, without the key.
void check_exists(const ConfigView& v, const std::string& p) {
  std::error_code ec;
  const bool folder = fs::is_directory(p, ec);
  if (!folder && fs::exists(p, ec)) return;
  std::string where;
  if (fs::path(p).is_relative())
    where = fmt::format(" (a relative path: read from the working directory '{}')",
                        fs::current_path(ec).string());
  v.error(
      fmt::format("'{}' {}{}", p, folder ? "is a folder, not a file" : "does not exist", where));
}

std::vector<std::string> paths(const Loading& l, const ConfigView& v) {
  std::vector<std::string> out;
  for (const auto& p : v.as_string_list()) {
    out.push_back(resolve(l, p));
    check_exists(v, out.back());
  }
  if (out.empty()) v.error("lists no files");
  return out;
}

cs::DType dtype_key(const ConfigView& a, const std::string& key, cs::DType def) {
  if (!a.has(key)) return def;
  std::string s = cs::ascii_lower(a.at(key).as_string());
  if (s == "f32" || s == "float32" || s == "float") return cs::DType::f32;
  if (s == "i32" || s == "int32") return cs::DType::i32;
  if (s == "i64" || s == "int64" || s == "long") return cs::DType::i64;
  if (s == "bool" || s == "boolean") return cs::DType::boolean;
  cs::fail("{}: must be f32, i32, i64 or bool, got '{}'", a.child_path(key), s);
}

// A loader over in-memory tensors: this worker's shard, batched.
DataLoaderPtr tensor_loader(const Loading& l, cs::Batch tensors) {
  auto ds = std::make_shared<cs::data::TensorDataset>(std::move(tensors));
  return std::make_shared<cs::utils::data::DataLoader>(
      [ds, o = l.loader](const cs::Config& args, const cs::utils::data::WorkerInfo& w) {
        LoaderOptions mine = o;
        mine.batch_size = args.at("batch_size").get<int64_t>();
        mine.worker = w;
        return std::make_shared<cs::data::DatasetLoader>(ds, mine);
      },
      l.args);
}

// The optional per-sample shape check (`features_shape` / `labels_shape`): the model's
// expectation, stated next to the data so a mismatch names the file instead of failing inside
// a layer.
void check_shape(const ConfigView& a, const std::string& key, const cs::Tensor& t,
                 const std::string& source) {
  if (!a.has(key)) return;
  ConfigView v = a.at(key);
  std::vector<int64_t> want;
  for (size_t i = 0; i < v.size(); ++i) want.push_back(v.at(i).as_int());
  cs::Shape s = t.shape();
  std::vector<int64_t> got(s.begin() + 1, s.end());
  if (got != want)
    cs::fail("{}: each sample has shape [{}] ({} [{}] in all), but {} is [{}]", source,
             fmt::join(got, ", "), cs::dtype_name(t.dtype()), fmt::join(s, ", "), a.child_path(key),
             fmt::join(want, ", "));
}

// Features and labels as the batch's tensors, after the checks every array processor shares.
DataLoaderPtr arrays_loader(const ConfigView& a, const Loading& l, cs::Tensor x,
                            const std::string& x_source, cs::Tensor y,
                            const std::string& y_source) {
  check_shape(a, "features_shape", x, x_source);
  cs::Batch b{{a.get_string("features_key", "x"), x}};
  if (y.defined()) {
    check_shape(a, "labels_shape", y, y_source);
    if (y.size(0) != x.size(0))
      cs::fail("{}: {} has {} samples but {} has {}", a.path(), x_source, x.size(0), y_source,
               y.size(0));
    std::string yk = a.get_string("labels_key", "y");
    if (b.count(yk))
      a.error(
          fmt::format("features_key and labels_key are both '{}': the batch needs two names", yk));
    b[yk] = y;
  } else if (a.has("labels_shape") || a.has("labels_dtype") || a.has("labels_key")) {
    a.error("labels_shape, labels_dtype and labels_key need labels");
  }
  if (x.size(0) < 1) cs::fail("{}: {} has no samples", a.path(), x_source);
  return tensor_loader(l, std::move(b));
}

const std::vector<std::string> kArrayKeys = {"features",       "labels",       "features_dtype",
                                             "labels_dtype",   "features_key", "labels_key",
                                             "features_shape", "labels_shape"};

std::vector<std::string> array_keys(std::vector<std::string> extra) {
  extra.insert(extra.end(), kArrayKeys.begin(), kArrayKeys.end());
  return keys(extra);
}

std::vector<cs::data::ColumnRef> column_refs(const ConfigView& a, const std::string& key) {
  std::vector<cs::data::ColumnRef> out;
  if (!a.has(key)) return out;
  ConfigView v = a.at(key);
  auto one = [&](const ConfigView& e) {
    if (e.value().is_number_integer()) {
      int64_t i = e.as_int();
      if (i < 0) e.error(fmt::format("a column index must be 0 or more, got {}", i));
      out.push_back({"", i});
    } else {
      out.push_back({e.as_string(), -1});
    }
  };
  if (v.value().is_array()) {
    if (v.size() == 0) v.error("lists no columns");
    for (size_t i = 0; i < v.size(); ++i) one(v.at(i));
  } else {
    one(v);
  }
  return out;
}

MODELZOO_REGISTER(data_processors, "CSVDataProcessor", [](const ConfigView& a) -> DataLoaderPtr {
  a.check_keys(array_keys({"files", "delimiter", "header"}));
  Loading l = loading(a);
  cs::data::CsvArrayOptions o;
  if (a.has("delimiter")) {
    const std::string d = a.at("delimiter").as_string();
    const bool tab = d == "tab" || d == "\\t";
    if (!tab && (d.size() != 1 || d[0] == '"' || d[0] == '\n' || d[0] == '\r'))
      a.at("delimiter").error("must be one character (not a quote or line break), or 'tab'");
    o.delimiter = tab ? '\t' : d[0];
  }
  o.header = a.get_bool("header", true);
  o.features = column_refs(a, "features");
  o.labels = column_refs(a, "labels");
  o.features_dtype = dtype_key(a, "features_dtype", cs::DType::f32);
  o.labels_dtype = dtype_key(a, "labels_dtype", cs::DType::i64);
  auto files = paths(l, a.at("files"));
  auto t = cs::data::read_csv_arrays(files, o);
  const std::string src = fmt::format("{}", fmt::join(files, ", "));
  return arrays_loader(a, l, t.features, src + " (features)", t.labels, src + " (labels)");
});

// Several arrays of one kind concatenated along the sample dimension.
cs::data::HostArray concat(std::vector<cs::data::HostArray> parts) {
  cs::data::HostArray out = std::move(parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    const auto& p = parts[i];
    bool same = p.type == out.type && p.shape.size() == out.shape.size() && !p.shape.empty() &&
                std::equal(p.shape.begin() + 1, p.shape.end(), out.shape.begin() + 1);
    if (!same)
      cs::fail(
          "{} ({} [{}]) does not match {} ({} [{}]): every file needs the same dtype and "
          "per-sample shape",
          p.where, cs::data::elem_type_name(p.type), fmt::join(p.shape, ", "), out.where,
          cs::data::elem_type_name(out.type), fmt::join(out.shape, ", "));
    out.shape[0] += p.shape[0];
    out.bytes.insert(out.bytes.end(), p.bytes.begin(), p.bytes.end());
  }
  return out;
}

cs::Tensor to_tensor(const cs::data::HostArray& h, cs::DType t) {
  if (h.shape.empty())
    cs::fail("{}: a scalar ({}); need at least one dimension (samples)", h.where,
             cs::data::elem_type_name(h.type));
  return cs::data::array_to_tensor(h, t);
}

std::string where_list(const std::vector<cs::data::HostArray>& parts) {
  std::vector<std::string> w;
  for (const auto& p : parts) w.push_back(p.where);
  return fmt::format("{}", fmt::join(w, ", "));
}

// Reads features and labels with `read(key)` (each key's parts) and builds the loader.
template <class Read>
DataLoaderPtr read_arrays(const ConfigView& a, const Loading& l, Read read) {
  auto xs = read("features");
  cs::Tensor x = to_tensor(concat(xs), dtype_key(a, "features_dtype", cs::DType::f32));
  cs::Tensor y;
  std::string ywhere;
  if (a.has("labels")) {
    auto ys = read("labels");
    ywhere = where_list(ys);
    y = to_tensor(concat(ys), dtype_key(a, "labels_dtype", cs::DType::i64));
  }
  return arrays_loader(a, l, x, where_list(xs), y, ywhere);
}

MODELZOO_REGISTER(data_processors, "NumpyDataProcessor", [](const ConfigView& a) -> DataLoaderPtr {
  a.check_keys(array_keys({"file"}));
  Loading l = loading(a);
  if (!a.has("features")) a.error("needs features (an array name with file, else .npy paths)");
  if (a.has("file")) {
    auto files = paths(l, a.at("file"));
    for (const auto& f : files)
      if (fs::path(f).extension() != ".npz")
        a.at("file").error(
            fmt::format("'{}' is not a .npz archive (give .npy files as features "
                        "and labels instead)",
                        f));
    return read_arrays(a, l, [&](const std::string& key) {
      std::string name = a.at(key).as_string();
      std::vector<cs::data::HostArray> parts;
      for (const auto& f : files) parts.push_back(cs::data::read_npz(f, name));
      return parts;
    });
  }
  return read_arrays(a, l, [&](const std::string& key) {
    std::vector<cs::data::HostArray> parts;
    for (const auto& f : paths(l, a.at(key))) {
      if (fs::path(f).extension() == ".npz")
        a.at(key).error(fmt::format(
            "'{}' is a .npz archive: give it as file and name its arrays in features and labels",
            f));
      parts.push_back(cs::data::read_npy(f));
    }
    return parts;
  });
});

MODELZOO_REGISTER(data_processors, "HDF5DataProcessor", [](const ConfigView& a) -> DataLoaderPtr {
  a.check_keys(array_keys({"file"}));
  Loading l = loading(a);
  auto files = paths(l, a.at("file"));
  if (!a.has("features")) a.error("needs features (the dataset of the inputs)");
  return read_arrays(a, l, [&](const std::string& key) {
    std::string name = a.at(key).as_string();
    std::vector<cs::data::HostArray> parts;
    for (const auto& f : files) parts.push_back(cs::data::read_h5_array(f, name));
    return parts;
  });
});

MODELZOO_REGISTER(
    data_processors, "JSONLTextDataProcessor", [](const ConfigView& a) -> DataLoaderPtr {
      a.check_keys(keys({"files", "text_field", "vocab_file", "merges_file", "eos_token",
                         "max_sequence_length", "vocab_size"}));
      Loading l = loading(a);
      auto files = paths(l, a.at("files"));
      std::string vocab = resolve(l, a.at("vocab_file").as_string());
      std::string merges = resolve(l, a.at("merges_file").as_string());
      for (const auto& [key, f] : {std::pair{"vocab_file", vocab}, {"merges_file", merges}})
        check_exists(a.at(key), f);
      auto tok = cs::data::BpeTokenizer::from_files(vocab, merges);
      std::string eos = a.get_string("eos_token", "<|endoftext|>");
      int64_t eos_id = tok.token_to_id(eos);
      if (eos_id < 0)
        cs::fail("{}: '{}' is not in the vocabulary '{}'", a.child_path("eos_token"), eos, vocab);
      int64_t msl = a.get_int("max_sequence_length", 128);
      if (msl < 1)
        cs::fail("{}: must be at least 1, got {}", a.child_path("max_sequence_length"), msl);
      int64_t vocab_size = detail::optional_vocab_size(a);
      auto tokens = std::make_shared<const std::vector<int32_t>>(cs::data::tokenize_jsonl(
          files, tok, a.get_string("text_field", "text"), eos_id, vocab_size));
      // Windows of msl + 1 tokens overlapping by one, as GPT flat token files are
      // cut: inputs are a window's first msl tokens, labels its last msl.
      int64_t n = (static_cast<int64_t>(tokens->size()) - 1) / msl;
      if (n < 1)
        cs::fail("{}: the files hold {} tokens, fewer than max_sequence_length + 1 = {}",
                 a.child_path("files"), tokens->size(), msl + 1);
      auto make = [tokens, msl](const std::vector<int64_t>& idx, int64_t) {
        const auto b = static_cast<int64_t>(idx.size());
        const auto len = static_cast<size_t>(b * msl);
        std::vector<int32_t> ids(len), labels(len), mask(len, 1);
        for (size_t j = 0; j < idx.size(); ++j) {
          const int32_t* w = tokens->data() + idx[j] * msl;
          std::copy(w, w + msl, ids.begin() + static_cast<int64_t>(j) * msl);
          std::copy(w + 1, w + msl + 1, labels.begin() + static_cast<int64_t>(j) * msl);
        }
        return cs::Batch{{"input_ids", cs::from_vector(ids, {b, msl})},
                         {"attention_mask", cs::from_vector(mask, {b, msl})},
                         {"labels", cs::from_vector(labels, {b, msl})}};
      };
      return std::make_shared<cs::utils::data::DataLoader>(
          [n, make, o = l.loader](const cs::Config& args, const cs::utils::data::WorkerInfo& w) {
            LoaderOptions mine = o;
            mine.batch_size = args.at("batch_size").get<int64_t>();
            mine.worker = w;
            return std::make_shared<cs::data::IndexBatchLoader>(n, mine, make);
          },
          l.args);
    });

}  // namespace
}  // namespace modelzoo
