// make_text_data: writes the embedded synthetic corpus as a model's files (GPT HDF5 + flat
// tokens, BERT rows, T5 flat tokens, translation pairs, JSON Lines text) with its BPE vocabulary,
// and can print a few documents and their tokens. The data processors do the same on first use.
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "cstorch/data/text.h"
#include "cstorch/data/tokenizer.h"

int main(int argc, char** argv) {
  namespace data = cstorch::data;
  CLI::App app{"Write the synthetic text corpus as a model's data files (no download)"};
  std::string out, kind = "gpt";
  int64_t msl = 128;
  int show = 0;
  data::SyntheticTextOptions o;
  app.add_option("--out", out, "Output directory (created if missing)")->required();
  app.add_option("--kind", kind, "gpt, bert, t5, translation or jsonl")
      ->check(CLI::IsMember({"gpt", "bert", "t5", "translation", "jsonl"}));
  app.add_option("--msl", msl, "Sequence length (gpt, bert)")->check(CLI::Range(8, 1 << 20));
  app.add_option("--train_documents", o.train_documents)->check(CLI::Range(1, 1 << 30));
  app.add_option("--val_documents", o.val_documents)->check(CLI::Range(1, 1 << 30));
  app.add_option("--vocab_size", o.vocab_size, "BPE vocabulary size (with 6 special tokens)")
      ->check(CLI::Range(262, 65535));
  app.add_option("--seed", o.seed);
  app.add_option("--show", show, "Print this many training documents with their token count")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    if (kind == "gpt") data::write_synthetic_gpt_data(out, msl, o);
    if (kind == "bert") data::write_synthetic_bert_data(out, msl, o);
    if (kind == "t5") data::write_synthetic_t5_data(out, o);
    if (kind == "translation") data::write_synthetic_translation_data(out, o);
    if (kind == "jsonl") data::write_synthetic_jsonl_data(out, o);
    auto tok = data::BpeTokenizer::from_files(out + "/vocab.json", out + "/merges.txt");
    std::printf("wrote %s data to %s (vocabulary of %lld tokens, %lld merges)\n", kind.c_str(),
                out.c_str(), static_cast<long long>(tok.vocab_size()),
                static_cast<long long>(tok.num_merges()));
    auto docs = data::synthetic_documents(show, o.seed);
    for (const auto& d : docs) {
      std::string text;
      for (const auto& s : d) text += " " + s;
      std::printf("[%zu tokens]%s\n", tok.encode(text).size(), text.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_text_data: %s\n", e.what());
    return 1;
  }
  return 0;
}
