// loom-tokenize: text files to a token file with GPT-2's tokenizer (or any
// byte-level BPE in its file format), and a token file back to text.
//
//   loom-tokenize --tokenizer DIR --output train.bin [--format loom|llmc] FILE...
//   loom-tokenize --tokenizer DIR --decode train.bin [--max-tokens N]
//
// DIR holds vocab.json and merges.txt (as Hugging Face's GPT-2 does) or
// encoder.json and vocab.bpe (OpenAI's). Each input file ("-": standard
// input) is one document; like llm.c's data scripts, every document starts
// with <|endoftext|>. --format loom (the default) writes Loom's token file
// with the vocabulary's size in its header; llmc writes llm.c's (GPT-2's
// 50257 ids). Either is train_gpt's --token-file. The file is written
// atomically (whole or not at all).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/gpt2_tokenizer.hpp"
#include "loom/data/token_file.hpp"

namespace {

std::string read_document(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in, "input ", path, ": cannot open it");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int encode_files(const loom::data::Gpt2Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                 const std::string& output, const std::string& format) {
  LOOM_CHECK(tokenizer.vocab_size() <= 65536, "the vocabulary has ", tokenizer.vocab_size(),
             " ids; token files hold uint16 ids (at most 65536)");
  LOOM_CHECK(format != "llmc" ||
                 tokenizer.vocab_size() <= static_cast<int32_t>(loom::data::kGpt2VocabSize),
             "--format llmc: the vocabulary has ", tokenizer.vocab_size(),
             " ids, more than llm.c's files hold (GPT-2's ", loom::data::kGpt2VocabSize, ")");
  const auto end_of_text = tokenizer.end_of_text();
  LOOM_CHECK(end_of_text.has_value(),
             "the vocabulary has no \"<|endoftext|>\" token to start each document with");
  const auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> ids;
  uint64_t bytes = 0;
  for (const std::string& input : inputs) {
    const std::string text = read_document(input);
    bytes += text.size();
    ids.push_back(*end_of_text);
    tokenizer.encode(text, ids);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<uint16_t> tokens(ids.begin(), ids.end());  // every id < 65536 (checked)
  if (format == "llmc") {
    loom::data::write_llmc_token_file(output, tokens);
  } else {
    loom::data::write_token_file(output, tokens, static_cast<uint32_t>(tokenizer.vocab_size()));
  }
  std::printf(
      "%s: %zu document(s), %llu bytes, %zu tokens (%.2f bytes per token), encoded in "
      "%.2f s (%.1f MB/s); %s format, vocabulary %d\n",
      output.c_str(), inputs.size(), static_cast<unsigned long long>(bytes), tokens.size(),
      tokens.empty() ? 0.0 : static_cast<double>(bytes) / static_cast<double>(tokens.size()),
      seconds, seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0.0, format.c_str(),
      tokenizer.vocab_size());
  return 0;
}

int decode_file(const loom::data::Gpt2Tokenizer& tokenizer, const std::string& path,
                int64_t max_tokens) {
  const loom::data::TokenFile file(path);
  const auto tokens = file.tokens();
  const size_t count =
      max_tokens < 0 ? tokens.size() : std::min(tokens.size(), static_cast<size_t>(max_tokens));
  const std::vector<int32_t> ids(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(count));
  const std::string text = tokenizer.decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenize text files with GPT-2's tokenizer into a token file, or decode one"};
  std::string tokenizer_dir;
  std::string output;
  std::string format = "loom";
  std::string decode;
  int64_t max_tokens = -1;
  std::vector<std::string> inputs;
  app.add_option("--tokenizer", tokenizer_dir,
                 "folder with vocab.json and merges.txt (or encoder.json and vocab.bpe)")
      ->required();
  auto* output_option = app.add_option("--output", output, "token file to write");
  app.add_option("--format", format, "token file format")->check(CLI::IsMember({"loom", "llmc"}));
  auto* decode_option = app.add_option("--decode", decode, "token file to print as text instead");
  app.add_option("--max-tokens", max_tokens, "with --decode: at most this many tokens")
      ->needs(decode_option);
  auto* inputs_option =
      app.add_option("inputs", inputs, "text files, one document each (- for stdin)");
  output_option->needs(inputs_option)->excludes(decode_option);
  inputs_option->needs(output_option);
  CLI11_PARSE(app, argc, argv);
  try {
    LOOM_CHECK(!decode.empty() || !output.empty(), "give --output and input files, or --decode");
    const auto tokenizer = loom::data::Gpt2Tokenizer::from_directory(tokenizer_dir);
    if (!decode.empty()) return decode_file(tokenizer, decode, max_tokens);
    return encode_files(tokenizer, inputs, output, format);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom-tokenize: %s\n", e.what());
    return 1;
  }
}
