// Loaders of the transformer models' batches: GPT (HDF5 and flat tokens), BERT rows with
// dynamic masking, T5 span corruption, translation pairs (see cstorch/data/text.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/internal.h"
#include "core/splitmix.h"
#include "cstorch/data/text.h"
#include "data/h5util.h"
#include "data/host_tensor.h"

namespace cstorch::data {

namespace fs = std::filesystem;

namespace {

uint64_t h(uint64_t a, uint64_t b) {
  return mix64(a ^ mix64(b + kGoldenGamma));
}
// Uniform in [0, 1) from 53 random bits.
double unit(uint64_t x) {
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

Tensor i32_tensor(const Shape& s, int32_t** p) {
  return detail::host_tensor(s, DType::i32, p);
}

// The five i32 tensors of an encoder-decoder batch ([b, S] source, [b, T] target) and pointers
// to their data, which the loaders fill.
struct Seq2SeqOut {
  int32_t *ids, *mask, *dec_ids, *dec_mask, *labels;
  Batch batch;
  Seq2SeqOut(int64_t b, int64_t S, int64_t T)
      : batch{{"input_ids", i32_tensor({b, S}, &ids)},
              {"attention_mask", i32_tensor({b, S}, &mask)},
              {"decoder_input_ids", i32_tensor({b, T}, &dec_ids)},
              {"decoder_attention_mask", i32_tensor({b, T}, &dec_mask)},
              {"labels", i32_tensor({b, T}, &labels)}} {}
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// IndexBatchLoader

IndexBatchLoader::IndexBatchLoader(int64_t n, LoaderOptions o, MakeBatch make)
    : DatasetLoader(n, std::move(o), "IndexBatchLoader"), make_(std::move(make)) {}

Batch IndexBatchLoader::fetch(const std::vector<int64_t>& indices, int64_t epoch) const {
  return make_(indices, epoch);
}

// ---------------------------------------------------------------------------------------------
// GPT

std::shared_ptr<utils::data::Loader> make_gpt_loader(const GptDataOptions& d,
                                                     const LoaderOptions& o) {
  const char* what = "GPT data";
  std::shared_ptr<Dataset> ds;
  std::shared_ptr<Hdf5TokenDataset> h5ds;
  int64_t msl;
  if (!d.hdf5_files.empty()) {
    CS_CHECK(d.flat_file.empty(), "{}: give HDF5 files or a flat token file, not both", what);
    h5ds = std::make_shared<Hdf5TokenDataset>(d.hdf5_files);
    msl = h5ds->max_sequence_length();
    CS_CHECK(d.max_sequence_length <= 0 || msl <= d.max_sequence_length,
             "{}: '{}' holds sequences of {} tokens, longer than max_sequence_length {}", what,
             h5ds->files()[0], msl, d.max_sequence_length);
    ds = h5ds;
  } else {
    CS_CHECK(!d.flat_file.empty(), "{}: no HDF5 files and no flat token file given", what);
    CS_CHECK(d.max_sequence_length >= 1,
             "{}: max_sequence_length must be given (>= 1) for a flat "
             "token file",
             what);
    msl = d.max_sequence_length;
    ds = std::make_shared<BinaryTokenDataset>(d.flat_file, msl, d.token_type, d.vocab_size);
  }
  int64_t vocab = d.vocab_size;
  auto make = [ds, h5ds, msl, vocab](const std::vector<int64_t>& idx, int64_t) {
    Batch in = ds->get_batch(idx);
    auto n = static_cast<int64_t>(idx.size());
    const auto* ids =
        static_cast<const int64_t*>(cstorch::detail::host_data(in.at("input_ids"), "GPT data"));
    const auto* mask = static_cast<const int64_t*>(
        cstorch::detail::host_data(in.at("attention_mask"), "GPT data"));
    const auto* lab =
        static_cast<const int64_t*>(cstorch::detail::host_data(in.at("labels"), "GPT data"));
    int32_t *oi, *om, *ol;
    Batch out{{"input_ids", i32_tensor({n, msl}, &oi)},
              {"attention_mask", i32_tensor({n, msl}, &om)},
              {"labels", i32_tensor({n, msl}, &ol)}};
    for (int64_t j = 0; j < n; ++j)
      for (int64_t t = 0; t < msl; ++t) {
        int64_t k = j * msl + t;
        bool counted = mask[k] != 0;
        for (auto [v, name] : {std::pair{ids[k], "input id"}, std::pair{lab[k], "label"}}) {
          if (vocab <= 0 || (v >= 0 && v < vocab) || (!counted && name[0] == 'l')) continue;
          auto [file, row] = h5ds
                                 ? h5ds->locate(idx[static_cast<size_t>(j)])
                                 : std::pair<std::string, int64_t>{"", idx[static_cast<size_t>(j)]};
          fail("GPT data: '{}' row {}: {} {} at position {} is outside the vocabulary 0..{}", file,
               row, name, v, t, vocab - 1);
        }
        oi[k] = static_cast<int32_t>(ids[k]);
        om[k] = counted ? 1 : 0;
        ol[k] = static_cast<int32_t>(lab[k]);
      }
    return out;
  };
  return std::make_shared<IndexBatchLoader>(ds->size(), o, make);
}

// ---------------------------------------------------------------------------------------------
// BERT

namespace {

// One BERT row file: the four datasets and the special ids.
struct BertFile {
  std::string path;
  hid_t file = -1, ids = -1, seg = -1, mask = -1, nsp = -1;
  int64_t rows = 0, msl = 0;
  int64_t cls = -1, sep = -1, mask_id = -1, pad = -1, vocab = -1;
  ~BertFile() {
    for (hid_t d : {ids, seg, mask, nsp})
      if (d >= 0) H5Dclose(d);
    if (file >= 0) H5Fclose(file);
  }
};

int64_t read_attr(const BertFile& f, const char* name) {
  if (H5Aexists(f.file, name) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    fail(
        "BERT data: '{}': attribute '{}' is missing (BERT row files carry vocab_size, cls_id, "
        "sep_id, mask_id and pad_id)",
        f.path, name);
  }
  hid_t a = H5Aopen(f.file, name, H5P_DEFAULT);
  int64_t v = 0;
  herr_t st = a < 0 ? -1 : H5Aread(a, H5T_NATIVE_INT64, &v);
  if (a >= 0) H5Aclose(a);
  if (st < 0) fail("BERT data: '{}': reading attribute '{}' failed: {}", f.path, name, h5::error());
  return v;
}

hid_t open_dataset(const BertFile& f, const char* name, int rank, int64_t* d0, int64_t* d1) {
  if (H5Lexists(f.file, name, H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    fail(
        "BERT data: '{}': no dataset '{}' (BERT row files hold input_ids, segment_ids, "
        "input_mask (N, msl) and next_sentence_labels (N))",
        f.path, name);
  }
  hid_t d = H5Dopen2(f.file, name, H5P_DEFAULT);
  if (d < 0) fail("BERT data: '{}': cannot open dataset '{}': {}", f.path, name, h5::error());
  hid_t type = H5Dget_type(d);
  bool integer = H5Tget_class(type) == H5T_INTEGER;
  H5Tclose(type);
  hid_t space = H5Dget_space(d);
  int r = H5Sget_simple_extent_ndims(space);
  hsize_t dims[8] = {};
  if (r > 0 && r <= 8) H5Sget_simple_extent_dims(space, dims, nullptr);
  H5Sclose(space);
  if (!integer || r != rank) {
    H5Dclose(d);
    fail("BERT data: '{}': dataset '{}' must be an integer array of rank {}, got rank {}{}", f.path,
         name, rank, r, integer ? "" : " (not integers)");
  }
  *d0 = static_cast<int64_t>(dims[0]);
  if (d1) *d1 = static_cast<int64_t>(dims[1]);
  return d;
}

void read_row(const BertFile& f, hid_t d, int64_t row, int64_t width, int32_t* out,
              const char* name) {
  hid_t fspace = H5Dget_space(d);
  hsize_t start[2] = {static_cast<hsize_t>(row), 0};
  hsize_t count[2] = {1, static_cast<hsize_t>(width)};
  hsize_t mdims[1] = {static_cast<hsize_t>(width)};
  hid_t mspace = H5Screate_simple(1, mdims, nullptr);
  herr_t st = H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
  if (st >= 0) st = H5Dread(d, H5T_NATIVE_INT32, mspace, fspace, H5P_DEFAULT, out);
  std::string err = st < 0 ? h5::error() : "";
  H5Sclose(mspace);
  H5Sclose(fspace);
  if (st < 0)
    fail("BERT data: '{}': reading row {} of '{}' failed (truncated or corrupt file?): {}", f.path,
         row, name, err);
}

class BertRows {
 public:
  BertRows(const std::vector<std::string>& files, int64_t msl_limit, int64_t vocab)
      : vocab_(vocab) {
    h5::quiet();
    for (const auto& p : h5::expand_files(files, "BERT data")) {
      CS_CHECK(fs::is_regular_file(p), "BERT data: '{}': no such file", p);
      auto f = std::make_unique<BertFile>();
      f->path = p;
      f->file = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      if (f->file < 0)
        fail("BERT data: '{}': cannot open as an HDF5 file (not HDF5, or truncated): {}", p,
             h5::error());
      int64_t n = 0, w = 0, n2 = 0, w2 = 0;
      f->ids = open_dataset(*f, "input_ids", 2, &n, &w);
      for (auto [slot, name] : {std::pair{&f->seg, "segment_ids"}, {&f->mask, "input_mask"}}) {
        *slot = open_dataset(*f, name, 2, &n2, &w2);
        CS_CHECK(n2 == n && w2 == w,
                 "BERT data: '{}': '{}' has shape ({}, {}) but input_ids has "
                 "({}, {})",
                 p, name, n2, w2, n, w);
      }
      f->nsp = open_dataset(*f, "next_sentence_labels", 1, &n2, nullptr);
      CS_CHECK(n2 == n, "BERT data: '{}': next_sentence_labels has {} rows but input_ids has {}", p,
               n2, n);
      CS_CHECK(msl_limit <= 0 || w <= msl_limit,
               "BERT data: '{}': rows of {} tokens are longer than max_sequence_length {}", p, w,
               msl_limit);
      CS_CHECK(msl_ == 0 || w == msl_, "BERT data: '{}' has rows of {} tokens but '{}' has {}", p,
               w, files_[0]->path, msl_);
      msl_ = w;
      f->rows = n;
      f->msl = w;
      f->cls = read_attr(*f, "cls_id");
      f->sep = read_attr(*f, "sep_id");
      f->mask_id = read_attr(*f, "mask_id");
      f->pad = read_attr(*f, "pad_id");
      f->vocab = read_attr(*f, "vocab_size");
      CS_CHECK(f->vocab <= vocab_,
               "BERT data: '{}' was written for a vocabulary of {} tokens, "
               "more than vocab_size {}",
               p, f->vocab, vocab_);
      for (auto [v, name] : {std::pair{f->cls, "cls_id"},
                             {f->sep, "sep_id"},
                             {f->mask_id, "mask_id"},
                             {f->pad, "pad_id"}})
        CS_CHECK(v >= 0 && v < vocab_, "BERT data: '{}': {} {} is outside the vocabulary 0..{}", p,
                 name, v, vocab_ - 1);
      starts_.push_back(total_);
      total_ += n;
      files_.push_back(std::move(f));
    }
    starts_.push_back(total_);
  }
  int64_t size() const { return total_; }
  int64_t msl() const { return msl_; }

  struct Row {
    std::vector<int32_t> ids, seg, mask;
    int32_t nsp;
    const BertFile* file;
    int64_t length;
  };
  Row read(int64_t i) const {
    size_t fi = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) -
                                    starts_.begin() - 1);
    const BertFile& f = *files_[fi];
    int64_t r = i - starts_[fi];
    Row row;
    row.file = &f;
    row.ids.resize(static_cast<size_t>(msl_));
    row.seg.resize(static_cast<size_t>(msl_));
    row.mask.resize(static_cast<size_t>(msl_));
    read_row(f, f.ids, r, msl_, row.ids.data(), "input_ids");
    read_row(f, f.seg, r, msl_, row.seg.data(), "segment_ids");
    read_row(f, f.mask, r, msl_, row.mask.data(), "input_mask");
    {
      hid_t fspace = H5Dget_space(f.nsp);
      hsize_t start[1] = {static_cast<hsize_t>(r)}, count[1] = {1};
      hid_t mspace = H5Screate_simple(1, count, nullptr);
      herr_t st = H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
      if (st >= 0) st = H5Dread(f.nsp, H5T_NATIVE_INT32, mspace, fspace, H5P_DEFAULT, &row.nsp);
      H5Sclose(mspace);
      H5Sclose(fspace);
      if (st < 0)
        fail("BERT data: '{}': reading row {} of 'next_sentence_labels' failed: {}", f.path, r,
             h5::error());
    }
    row.length = 0;
    for (int64_t t = 0; t < msl_; ++t) {
      auto k = static_cast<size_t>(t);
      int32_t v = row.ids[k];
      CS_CHECK(v >= 0 && v < vocab_,
               "BERT data: '{}' row {}: token id {} at position {} is outside the vocabulary "
               "0..{}",
               f.path, r, v, t, vocab_ - 1);
      CS_CHECK(row.seg[k] == 0 || row.seg[k] == 1,
               "BERT data: '{}' row {}: segment id {} at position {} is not 0 or 1", f.path, r,
               row.seg[k], t);
      if (row.mask[k]) row.length = t + 1;
    }
    CS_CHECK(row.nsp == 0 || row.nsp == 1,
             "BERT data: '{}' row {}: next_sentence_label {} is not 0 or 1", f.path, r, row.nsp);
    return row;
  }

 private:
  std::vector<std::unique_ptr<BertFile>> files_;
  std::vector<int64_t> starts_;
  int64_t total_ = 0, msl_ = 0, vocab_;
};

}  // namespace

std::pair<std::vector<int32_t>, std::vector<int32_t>> bert_mask_row(
    const std::vector<int32_t>& ids, int64_t length, int64_t vocab_size, double p, int64_t mask_id,
    const std::vector<int64_t>& special, uint64_t key) {
  std::vector<int32_t> out = ids, labels(ids.size(), -100);
  auto is_special = [&](int64_t v) {
    return std::find(special.begin(), special.end(), v) != special.end();
  };
  CS_CHECK(vocab_size > static_cast<int64_t>(special.size()),
           "bert_mask_row: vocab_size {} leaves no non-special token", vocab_size);
  // Every row predicts at least one token (the candidate of the lowest draw when the draws
  // select none), as BERT's pre-training data does: a batch of rows without one has a loss
  // averaged over no tokens, NaN, which trained the weights to NaN.
  const int64_t n = std::min<int64_t>(length, static_cast<int64_t>(ids.size()));
  int64_t fallback = -1;
  uint64_t lowest = 0;
  bool any = false;
  for (int64_t t = 0; t < n; ++t) {
    if (is_special(ids[static_cast<size_t>(t)])) continue;
    uint64_t r = h(key, static_cast<uint64_t>(t));
    if (unit(r) < p) any = true;
    if (fallback < 0 || r < lowest) fallback = t, lowest = r;
  }
  for (int64_t t = 0; t < n; ++t) {
    auto k = static_cast<size_t>(t);
    if (is_special(ids[k])) continue;
    uint64_t r = h(key, static_cast<uint64_t>(t));
    if (unit(r) >= p && (any || t != fallback)) continue;
    labels[k] = ids[k];
    double u = unit(h(r, 1));
    if (u < 0.8) {
      out[k] = static_cast<int32_t>(mask_id);
    } else if (u < 0.9) {
      // A uniformly drawn non-special token (redraw past the specials).
      uint64_t s = h(r, 2);
      int64_t v;
      do {
        v = static_cast<int64_t>(splitmix64_next(s) % static_cast<uint64_t>(vocab_size));
      } while (is_special(v));
      out[k] = static_cast<int32_t>(v);
    }
  }
  return {out, labels};
}

std::shared_ptr<utils::data::Loader> make_bert_loader(const BertDataOptions& d,
                                                      const LoaderOptions& o) {
  CS_CHECK(d.vocab_size >= 1, "BERT data: vocab_size must be given (>= 1), got {}", d.vocab_size);
  CS_CHECK(d.mlm_probability > 0 && d.mlm_probability < 1,
           "BERT data: mlm_probability must be in (0, 1), got {}", d.mlm_probability);
  auto rows = std::make_shared<BertRows>(d.files, d.max_sequence_length, d.vocab_size);
  int64_t msl = rows->msl();
  auto make = [rows, msl, d](const std::vector<int64_t>& idx, int64_t epoch) {
    auto n = static_cast<int64_t>(idx.size());
    int32_t *ii, *am, *tt, *ml, *ns;
    Batch out{{"input_ids", i32_tensor({n, msl}, &ii)},
              {"attention_mask", i32_tensor({n, msl}, &am)},
              {"token_type_ids", i32_tensor({n, msl}, &tt)},
              {"mlm_labels", i32_tensor({n, msl}, &ml)},
              {"next_sentence_label", i32_tensor({n}, &ns)}};
    uint64_t ekey = h(d.mask_seed, static_cast<uint64_t>(epoch));
    for (int64_t j = 0; j < n; ++j) {
      int64_t i = idx[static_cast<size_t>(j)];
      auto row = rows->read(i);
      const BertFile& f = *row.file;
      auto [masked, labels] =
          bert_mask_row(row.ids, row.length, d.vocab_size, d.mlm_probability, f.mask_id,
                        {f.cls, f.sep, f.pad, f.mask_id}, h(ekey, static_cast<uint64_t>(i)));
      std::copy(masked.begin(), masked.end(), ii + j * msl);
      std::copy(row.mask.begin(), row.mask.end(), am + j * msl);
      std::copy(row.seg.begin(), row.seg.end(), tt + j * msl);
      std::copy(labels.begin(), labels.end(), ml + j * msl);
      for (int64_t t = 0; t < msl; ++t) am[j * msl + t] = am[j * msl + t] ? 1 : 0;
      ns[j] = row.nsp;
    }
    return out;
  };
  return std::make_shared<IndexBatchLoader>(rows->size(), o, make);
}

// ---------------------------------------------------------------------------------------------
// T5

std::pair<int64_t, int64_t> t5_span_lengths(int64_t inputs_length, double density,
                                            double mean_span) {
  CS_CHECK(inputs_length >= 2, "T5 span corruption: the inputs length must be at least 2, got {}",
           inputs_length);
  CS_CHECK(density > 0 && density < 1,
           "T5 span corruption: noise_density must be in (0, 1), got {}", density);
  CS_CHECK(mean_span >= 1, "T5 span corruption: mean_noise_span_length must be >= 1, got {}",
           mean_span);
  auto lengths = [&](int64_t tokens) {
    auto noise = static_cast<int64_t>(std::nearbyint(static_cast<double>(tokens) * density));
    int64_t nonnoise = tokens - noise;
    auto spans = static_cast<int64_t>(std::nearbyint(static_cast<double>(noise) / mean_span));
    // Inputs: kept tokens, a sentinel per span and eos; targets: noise, sentinels, eos.
    return std::pair{nonnoise + spans + 1, noise + spans + 1};
  };
  int64_t tokens = inputs_length - 1;
  while (lengths(tokens + 1).first <= inputs_length) ++tokens;
  auto [in, tgt] = lengths(tokens);
  (void)in;
  if (density == 0.5 && tgt > inputs_length) {
    --tokens;
    --tgt;
  }
  return {tokens, tgt};
}

std::vector<bool> t5_noise_mask(int64_t orig_length, double density, double mean_span,
                                uint64_t key) {
  int64_t length = std::max<int64_t>(orig_length, 2);
  auto noise = static_cast<int64_t>(std::nearbyint(static_cast<double>(length) * density));
  noise = std::min(std::max<int64_t>(noise, 1), length - 1);
  auto spans = static_cast<int64_t>(std::nearbyint(static_cast<double>(noise) / mean_span));
  spans = std::max<int64_t>(spans, 1);
  int64_t nonnoise = length - noise;
  uint64_t s = key;
  // Splits `items` into `segments` non-empty runs: segments - 1 distinct cut points among the
  // items - 1 gaps, uniformly (a partial Fisher-Yates draw).
  auto segmentation = [&](int64_t items, int64_t segments) {
    std::vector<int64_t> gaps(static_cast<size_t>(items - 1));
    for (int64_t k = 0; k < items - 1; ++k) gaps[static_cast<size_t>(k)] = k + 1;
    for (int64_t k = 0; k < segments - 1; ++k) {
      auto r = static_cast<int64_t>(splitmix64_next(s) % static_cast<uint64_t>(items - 1 - k));
      std::swap(gaps[static_cast<size_t>(k)], gaps[static_cast<size_t>(k + r)]);
    }
    std::vector<int64_t> cuts(gaps.begin(), gaps.begin() + (segments - 1));
    std::sort(cuts.begin(), cuts.end());
    std::vector<int64_t> len;
    int64_t prev = 0;
    for (int64_t c : cuts) {
      len.push_back(c - prev);
      prev = c;
    }
    len.push_back(items - prev);
    return len;
  };
  // With fewer items than spans (tiny lengths) T5's segmentation yields empty spans; clamp.
  int64_t noise_spans = std::min(spans, noise), kept_spans = std::min(spans, nonnoise);
  auto noise_len = segmentation(noise, noise_spans);
  auto kept_len = segmentation(nonnoise, kept_spans);
  noise_len.resize(static_cast<size_t>(spans), 0);
  kept_len.resize(static_cast<size_t>(spans), 0);
  std::vector<bool> mask;
  for (int64_t k = 0; k < spans; ++k) {
    mask.insert(mask.end(), static_cast<size_t>(kept_len[static_cast<size_t>(k)]), false);
    mask.insert(mask.end(), static_cast<size_t>(noise_len[static_cast<size_t>(k)]), true);
  }
  mask.resize(static_cast<size_t>(orig_length));
  return mask;
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> t5_corrupt(const std::vector<int32_t>& tokens,
                                                                 const std::vector<bool>& noise,
                                                                 int64_t vocab_size,
                                                                 int64_t eos_id) {
  CS_CHECK(tokens.size() == noise.size(), "t5_corrupt: {} tokens but a noise mask of {}",
           tokens.size(), noise.size());
  std::vector<int32_t> in, tgt;
  int64_t in_span = 0, tgt_span = 0;
  for (size_t k = 0; k < tokens.size(); ++k) {
    bool starts = k == 0 || noise[k] != noise[k - 1];
    if (noise[k]) {
      if (starts) in.push_back(static_cast<int32_t>(vocab_size - 1 - in_span++));
      tgt.push_back(tokens[k]);
    } else {
      if (starts) tgt.push_back(static_cast<int32_t>(vocab_size - 1 - tgt_span++));
      in.push_back(tokens[k]);
    }
  }
  in.push_back(static_cast<int32_t>(eos_id));
  tgt.push_back(static_cast<int32_t>(eos_id));
  return {in, tgt};
}

namespace {

// A flat little-endian token file read by position (pread), values checked.
class FlatTokens {
 public:
  FlatTokens(std::string path, TokenType type) : path_(std::move(path)), type_(type) {
    size_ = type == TokenType::u16 ? 2 : type == TokenType::i64 ? 8 : 4;
    fd_ = ::open(path_.c_str(),
                 O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO is refused, not waited on
    if (fd_ < 0) fail("T5 data: cannot open '{}': {}", path_, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail("T5 data: '{}' is not a regular file", path_);
    }
    if (static_cast<size_t>(st.st_size) % size_ != 0) {
      ::close(fd_);
      fail("T5 data: '{}': size {} bytes is not a whole number of {}-byte tokens", path_,
           st.st_size, size_);
    }
    n_ = static_cast<int64_t>(static_cast<size_t>(st.st_size) / size_);
  }
  ~FlatTokens() {
    if (fd_ >= 0) ::close(fd_);
  }
  int64_t size() const { return n_; }
  const std::string& path() const { return path_; }
  void read(int64_t start, int64_t count, std::vector<int64_t>* out) const {
    std::vector<uint8_t> buf(static_cast<size_t>(count) * size_);
    size_t got = 0;
    auto off = static_cast<off_t>(static_cast<size_t>(start) * size_);
    while (got < buf.size()) {
      ssize_t r = ::pread(fd_, buf.data() + got, buf.size() - got, off + static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        fail("T5 data: '{}': reading tokens {}..{} failed: {}", path_, start, start + count - 1,
             r < 0 ? std::strerror(errno) : "the file is shorter than it was");
      got += static_cast<size_t>(r);
    }
    out->resize(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) {
      const uint8_t* p = buf.data() + static_cast<size_t>(k) * size_;
      int64_t v = 0;
      if (type_ == TokenType::u16) {
        uint16_t x;
        std::memcpy(&x, p, 2);
        v = x;
      } else if (type_ == TokenType::i32) {
        int32_t x;
        std::memcpy(&x, p, 4);
        v = x;
      } else if (type_ == TokenType::u32) {
        uint32_t x;
        std::memcpy(&x, p, 4);
        v = x;
      } else {
        std::memcpy(&v, p, 8);
      }
      (*out)[static_cast<size_t>(k)] = v;
    }
  }

 private:
  std::string path_;
  TokenType type_;
  size_t size_;
  int fd_ = -1;
  int64_t n_ = 0;
};

}  // namespace

std::shared_ptr<utils::data::Loader> make_t5_loader(const T5DataOptions& d,
                                                    const LoaderOptions& o) {
  const char* what = "T5 data";
  CS_CHECK(d.extra_ids >= 1, "{}: extra_ids must be at least 1, got {}", what, d.extra_ids);
  CS_CHECK(d.vocab_size > d.extra_ids, "{}: vocab_size {} must exceed extra_ids {}", what,
           d.vocab_size, d.extra_ids);
  CS_CHECK(d.max_sequence_length >= 2, "{}: max_sequence_length must be at least 2, got {}", what,
           d.max_sequence_length);
  // (Named variables, not a structured binding: the lambda below captures tokens_len, which
  // clang 14 does not allow for a binding.)
  const auto spans_len =
      t5_span_lengths(d.max_sequence_length, d.noise_density, d.mean_noise_span_length);
  const int64_t tokens_len = spans_len.first, targets_len = spans_len.second;
  int64_t S = d.max_sequence_length;
  int64_t T = d.max_target_length > 0 ? d.max_target_length : targets_len;
  CS_CHECK(T >= targets_len,
           "{}: max_target_length {} is shorter than the {} target tokens span corruption makes "
           "from {} input tokens (noise_density {}, mean_noise_span_length {}); the encoder and "
           "decoder lengths do not match (use {} or more, or leave it out)",
           what, T, targets_len, S, d.noise_density, d.mean_noise_span_length, targets_len);
  {
    // Noise spans per sample (one sentinel each), as t5_noise_mask counts them.
    auto noise =
        static_cast<int64_t>(std::nearbyint(static_cast<double>(tokens_len) * d.noise_density));
    noise = std::min(std::max<int64_t>(noise, 1), std::max<int64_t>(tokens_len, 2) - 1);
    auto spans = std::max<int64_t>(1, static_cast<int64_t>(std::nearbyint(
                                          static_cast<double>(noise) / d.mean_noise_span_length)));
    CS_CHECK(spans <= d.extra_ids,
             "{}: {} noise spans per sample need more sentinels than extra_ids {}", what, spans,
             d.extra_ids);
  }
  auto file = std::make_shared<FlatTokens>(d.file, d.token_type);
  int64_t n = file->size() / tokens_len;
  CS_CHECK(n >= 1, "{}: '{}' holds {} tokens, fewer than one sample of {}", what, d.file,
           file->size(), tokens_len);
  int64_t first_sentinel = d.vocab_size - d.extra_ids;
  auto make = [file, d, S, T, tokens_len, first_sentinel](const std::vector<int64_t>& idx,
                                                          int64_t epoch) {
    auto b = static_cast<int64_t>(idx.size());
    Seq2SeqOut o(b, S, T);
    int32_t *ii = o.ids, *am = o.mask, *di = o.dec_ids, *dm = o.dec_mask, *lb = o.labels;
    Batch& out = o.batch;
    uint64_t ekey = h(d.noise_seed, static_cast<uint64_t>(epoch));
    std::vector<int64_t> raw;
    for (int64_t j = 0; j < b; ++j) {
      int64_t i = idx[static_cast<size_t>(j)];
      file->read(i * tokens_len, tokens_len, &raw);
      std::vector<int32_t> toks(raw.size());
      for (size_t k = 0; k < raw.size(); ++k) {
        CS_CHECK(raw[k] >= 0 && raw[k] < first_sentinel,
                 "T5 data: '{}' token {} (sample {}): id {} is outside 0..{} (ids from {} are the "
                 "sentinels of the top {} extra_ids)",
                 file->path(), i * tokens_len + static_cast<int64_t>(k), i, raw[k],
                 first_sentinel - 1, first_sentinel, d.extra_ids);
        toks[k] = static_cast<int32_t>(raw[k]);
      }
      auto noise = t5_noise_mask(tokens_len, d.noise_density, d.mean_noise_span_length,
                                 h(ekey, static_cast<uint64_t>(i)));
      auto [in, tgt] = t5_corrupt(toks, noise, d.vocab_size, d.eos_id);
      for (int64_t t = 0; t < S; ++t) {
        bool real = t < static_cast<int64_t>(in.size());
        ii[j * S + t] = real ? in[static_cast<size_t>(t)] : static_cast<int32_t>(d.pad_id);
        am[j * S + t] = real ? 1 : 0;
      }
      for (int64_t t = 0; t < T; ++t) {
        auto nt = static_cast<int64_t>(tgt.size());
        lb[j * T + t] = t < nt ? tgt[static_cast<size_t>(t)] : static_cast<int32_t>(d.pad_id);
        dm[j * T + t] = t < nt ? 1 : 0;
        di[j * T + t] = t == 0       ? static_cast<int32_t>(d.decoder_start_id)
                        : t - 1 < nt ? tgt[static_cast<size_t>(t - 1)]
                                     : static_cast<int32_t>(d.pad_id);
      }
    }
    return std::move(out);  // out refers to o.batch
  };
  return std::make_shared<IndexBatchLoader>(n, o, make);
}

// ---------------------------------------------------------------------------------------------
// Translation pairs

struct ParallelCorpus {
  ParallelDataOptions opts;
  std::vector<std::vector<int32_t>> src, tgt;
};

std::vector<std::vector<int32_t>> read_token_lines(const std::string& path, int64_t vocab) {
  CS_CHECK(fs::is_regular_file(path), "translation data: '{}': no such file", path);
  std::ifstream f(path);
  CS_CHECK(f.good(), "translation data: cannot open '{}'", path);
  std::vector<std::vector<int32_t>> out;
  std::string line;
  for (int64_t lineno = 1; std::getline(f, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      if (i >= line.size()) break;
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
      std::string word = line.substr(i, j - i);
      size_t used = 0;
      int64_t v = -1;
      try {
        v = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      CS_CHECK(used == word.size() && !word.empty(),
               "translation data: '{}' line {}: \"{}\" is not a token id (lines hold "
               "space-separated integers)",
               path, lineno, word);
      CS_CHECK(v >= 0 && (vocab <= 0 || v < vocab),
               "translation data: '{}' line {}: token id {} is outside the vocabulary 0..{}", path,
               lineno, v, vocab - 1);
      ids.push_back(static_cast<int32_t>(v));
      i = j;
    }
    CS_CHECK(!ids.empty(), "translation data: '{}' line {}: empty sentence", path, lineno);
    out.push_back(std::move(ids));
  }
  return out;
}

std::shared_ptr<const ParallelCorpus> load_parallel_corpus(const ParallelDataOptions& d) {
  const char* what = "translation data";
  CS_CHECK(d.max_sequence_length >= 2 && d.max_target_length >= 2,
           "{}: max_sequence_length and max_target_length must be at least 2, got {} and {}", what,
           d.max_sequence_length, d.max_target_length);
  CS_CHECK(d.vocab_size >= 1, "{}: vocab_size must be given (>= 1)", what);
  auto c = std::make_shared<ParallelCorpus>();
  c->opts = d;
  c->src = read_token_lines(d.source_file, d.vocab_size);
  c->tgt = read_token_lines(d.target_file, d.vocab_size);
  CS_CHECK(c->src.size() == c->tgt.size(),
           "{}: '{}' has {} sentences but '{}' has {}; line i of one must translate line i of the "
           "other",
           what, d.source_file, c->src.size(), d.target_file, c->tgt.size());
  CS_CHECK(!c->src.empty(), "{}: '{}' holds no sentences", what, d.source_file);
  for (size_t i = 0; i < c->src.size(); ++i) {
    // +1: the eos (source, labels) or start token (decoder inputs) each side gets.
    auto ls = static_cast<int64_t>(c->src[i].size()) + 1,
         lt = static_cast<int64_t>(c->tgt[i].size()) + 1;
    CS_CHECK(ls <= d.max_sequence_length,
             "{}: '{}' line {}: {} tokens with eos is longer than max_sequence_length {}", what,
             d.source_file, i + 1, ls, d.max_sequence_length);
    CS_CHECK(lt <= d.max_target_length,
             "{}: '{}' line {}: {} tokens with eos is longer than max_target_length {}", what,
             d.target_file, i + 1, lt, d.max_target_length);
  }
  return c;
}

int64_t parallel_corpus_size(const ParallelCorpus& c) {
  return static_cast<int64_t>(c.src.size());
}

std::shared_ptr<utils::data::Loader> make_parallel_loader(std::shared_ptr<const ParallelCorpus> c,
                                                          const LoaderOptions& o) {
  CS_CHECK(c != nullptr, "make_parallel_loader: corpus is null");
  auto make = [c](const std::vector<int64_t>& idx, int64_t) {
    const auto& d = c->opts;
    int64_t S = d.max_sequence_length, T = d.max_target_length;
    auto b = static_cast<int64_t>(idx.size());
    Seq2SeqOut o(b, S, T);
    int32_t *ii = o.ids, *am = o.mask, *di = o.dec_ids, *dm = o.dec_mask, *lb = o.labels;
    Batch& out = o.batch;
    auto pad = static_cast<int32_t>(d.pad_id), eos = static_cast<int32_t>(d.eos_id);
    for (int64_t j = 0; j < b; ++j) {
      const auto& s = c->src[static_cast<size_t>(idx[static_cast<size_t>(j)])];
      const auto& t = c->tgt[static_cast<size_t>(idx[static_cast<size_t>(j)])];
      auto ns = static_cast<int64_t>(s.size()), nt = static_cast<int64_t>(t.size());
      for (int64_t k = 0; k < S; ++k) {
        ii[j * S + k] = k < ns ? s[static_cast<size_t>(k)] : k == ns ? eos : pad;
        am[j * S + k] = k <= ns ? 1 : 0;
      }
      for (int64_t k = 0; k < T; ++k) {
        lb[j * T + k] = k < nt ? t[static_cast<size_t>(k)] : k == nt ? eos : pad;
        dm[j * T + k] = k <= nt ? 1 : 0;
        di[j * T + k] = k == 0    ? static_cast<int32_t>(d.start_id)
                        : k <= nt ? t[static_cast<size_t>(k - 1)]
                                  : pad;
      }
    }
    return std::move(out);  // out refers to o.batch
  };
  return std::make_shared<IndexBatchLoader>(parallel_corpus_size(*c), o, make);
}

}  // namespace cstorch::data
