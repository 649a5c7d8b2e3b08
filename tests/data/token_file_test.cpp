// The text corpus, token file builds (contents, cap, atomicity, determinism),
// the validating memory map (truncation, wrong magic, bad tokens), the splits
// and the unigram baseline.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "loom/data/text_corpus.hpp"
#include "loom/data/token_file.hpp"
#include "temp_dir.hpp"

using Catch::Matchers::Contains;
using loom::data::TokenFile;
using loom::data::TokenFileOptions;
using loom::test::TempDir;
namespace data = loom::data;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A corpus of three documents under dir/corpus; options reading only it.
TokenFileOptions small_corpus(const TempDir& dir) {
  dir.write("corpus/b.txt", "bb");
  dir.write("corpus/a.txt", "hello\n");
  dir.write("corpus/sub/c.txt", std::string("\xff\x00z", 3));
  dir.write("corpus/skip.bin", "ignored");
  TokenFileOptions options;
  options.corpus.roots = {dir.file("corpus")};
  options.corpus.suffixes = {".txt"};
  return options;
}

std::vector<uint16_t> to_vector(std::span<const uint16_t> s) {
  return std::vector<uint16_t>(s.begin(), s.end());
}

std::vector<uint16_t> bytes_then_end(const std::string& text) {
  std::vector<uint16_t> t;
  for (unsigned char c : text) t.push_back(c);
  t.push_back(data::kEndOfDocument);
  return t;
}

}  // namespace

TEST_CASE("the default corpus is this machine's Python library, in sorted order", "[data][attn]") {
  const std::vector<std::string> files = data::text_corpus_files();
  REQUIRE(files.size() > 10);
  CHECK(std::is_sorted(files.begin(), files.end()));
  for (const std::string& f : files) {
    INFO(f);
    const bool python = f.rfind("/usr/lib/python3.", 0) == 0 && f.size() > 3 &&
                        f.compare(f.size() - 3, 3, ".py") == 0;
    const bool docs = f.rfind("/usr/share/doc/", 0) == 0;
    REQUIRE((python || docs));
    REQUIRE(f.find("-packages/") == std::string::npos);
  }
  CHECK(data::text_corpus_files() == files);  // deterministic
}

TEST_CASE("build_token_file writes the documents byte by byte in path order", "[data][attn]") {
  TempDir dir;
  const TokenFileOptions options = small_corpus(dir);
  const std::string path = dir.file("tokens.bin");
  const data::TokenFileSummary summary = data::build_token_file(path, options);
  CHECK(summary.documents == 3);
  CHECK(summary.corpus_bytes == 6 + 2 + 3);
  CHECK(summary.tokens == 11 + 3);

  const TokenFile file(path);
  CHECK(file.vocab_size() == 257);
  std::vector<uint16_t> want = bytes_then_end("hello\n");  // a.txt, b.txt, sub/c.txt
  for (uint16_t t : bytes_then_end("bb")) want.push_back(t);
  for (uint16_t t : bytes_then_end(std::string("\xff\x00z", 3))) want.push_back(t);
  CHECK(to_vector(file.tokens()) == want);
  CHECK(std::filesystem::file_size(path) == 32 + 2 * want.size());

  // Only the target remains: no temporary files beside it.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    entries += e.is_regular_file();
  CHECK(entries == 1);

  // Rebuilding gives the same bytes.
  const std::string again = dir.file("again.bin");
  data::build_token_file(again, options);
  CHECK(read_bytes(again) == read_bytes(path));
}

TEST_CASE("build_token_file cuts the corpus at max_bytes", "[data][attn]") {
  TempDir dir;
  TokenFileOptions options = small_corpus(dir);
  options.corpus.max_bytes = 7;  // "hello\n" and one byte of "bb"
  const data::TokenFileSummary summary = data::build_token_file(dir.file("t.bin"), options);
  CHECK(summary.corpus_bytes == 7);
  CHECK(summary.documents == 2);
  const TokenFile file(dir.file("t.bin"));
  std::vector<uint16_t> want = bytes_then_end("hello\n");
  for (uint16_t t : bytes_then_end("b")) want.push_back(t);
  CHECK(to_vector(file.tokens()) == want);
}

TEST_CASE("a failed build leaves no file behind", "[data][attn]") {
  TempDir dir;
  const TokenFileOptions options = small_corpus(dir);
  const std::string missing_dir = dir.file("no/such/dir/t.bin");
  CHECK_THROWS_WITH(data::build_token_file(missing_dir, options),
                    Contains("cannot create temporary file"));
  CHECK(!std::filesystem::exists(missing_dir));

  TokenFileOptions empty;
  empty.corpus.roots = {dir.file("nothing")};
  CHECK_THROWS_WITH(data::build_token_file(dir.file("t.bin"), empty),
                    Contains("no text files found under " + dir.file("nothing")));
  CHECK(!std::filesystem::exists(dir.file("t.bin")));
}

TEST_CASE("ensure_token_file builds once and refuses a corrupt file", "[data][attn]") {
  TempDir dir;
  const TokenFileOptions options = small_corpus(dir);
  const std::string path = dir.file("t.bin");
  CHECK(data::ensure_token_file(path, options));
  const std::string first = read_bytes(path);
  CHECK_FALSE(data::ensure_token_file(path, options));
  CHECK(read_bytes(path) == first);

  write_bytes(path, first.substr(0, first.size() - 2));
  CHECK_THROWS_WITH(data::ensure_token_file(path, options), Contains(path));
}

TEST_CASE("TokenFile rejects truncated and foreign files naming the path", "[data][attn]") {
  TempDir dir;
  const std::string path = dir.file("t.bin");
  data::build_token_file(path, small_corpus(dir));
  const std::string good = read_bytes(path);
  const std::string bad = dir.file("bad.bin");

  write_bytes(bad, good.substr(0, good.size() - 1));
  CHECK_THROWS_WITH(TokenFile(bad), Contains(bad) && Contains("header says 14 tokens") &&
                                        Contains("truncated or corrupt"));
  write_bytes(bad, good + "xx");
  CHECK_THROWS_WITH(TokenFile(bad), Contains("but the file has 62 bytes"));
  write_bytes(bad, good.substr(0, 20));
  CHECK_THROWS_WITH(TokenFile(bad), Contains("shorter than the 32-byte header"));

  std::string wrong = good;
  wrong[0] = 'X';
  write_bytes(bad, wrong);
  CHECK_THROWS_WITH(TokenFile(bad), Contains(bad) && Contains("wrong magic"));

  wrong = good;
  wrong[8] = 2;  // version 2
  write_bytes(bad, wrong);
  CHECK_THROWS_WITH(TokenFile(bad), Contains("version 2 is not the supported version 1"));

  wrong = good;
  wrong[32] = static_cast<char>(0x01);  // token 0 becomes 0x0101 = 257
  wrong[33] = static_cast<char>(0x01);
  write_bytes(bad, wrong);
  CHECK_THROWS_WITH(TokenFile(bad), Contains("token 0 is 257, not below the vocab size 257"));

  CHECK_THROWS_WITH(TokenFile(dir.file("absent.bin")), Contains("cannot open"));
}

TEST_CASE("TokenFile reads llm.c's token files (GPT-2 tokens) and refuses damaged ones",
          "[data][attn]") {
  // llm.c's layout: 256 int32 (magic 20240520, version 1, the count, zeros), uint16 tokens.
  const auto llmc = [](int32_t version, int32_t count, const std::vector<uint16_t>& tokens) {
    std::vector<int32_t> header(256, 0);
    header[0] = data::kLlmcMagic;
    header[1] = version;
    header[2] = count;
    std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
    return bytes;
  };
  TempDir dir;
  const std::string path = dir.file("tiny_shakespeare_val.bin");
  const std::vector<uint16_t> tokens = {50256, 5962, 22307, 25, 198, 8421, 356, 50256};
  write_bytes(path, llmc(1, 8, tokens));
  const TokenFile file(path);
  CHECK(file.vocab_size() == data::kGpt2VocabSize);
  CHECK(file.from_llmc());
  CHECK(to_vector(file.tokens()) == tokens);
  CHECK(data::ensure_token_file(path) == false);  // accepted as it is, never rebuilt

  write_bytes(path, llmc(2, 8, tokens));
  CHECK_THROWS_WITH(TokenFile(path),
                    Contains(path) && Contains("llm.c version 2 is not version 1"));
  write_bytes(path, llmc(1, 9, tokens));
  CHECK_THROWS_WITH(TokenFile(path),
                    Contains("llm.c header says 9 tokens") && Contains("truncated or corrupt"));
  std::vector<uint16_t> beyond = tokens;
  beyond[3] = 50257;
  write_bytes(path, llmc(1, 8, beyond));
  CHECK_THROWS_WITH(TokenFile(path), Contains("token 3 is 50257, not below the vocab size 50257"));
  write_bytes(path, llmc(1, 8, tokens).substr(0, 100));
  CHECK_THROWS_WITH(TokenFile(path), Contains("shorter than llm.c's 1024-byte header"));
}

TEST_CASE("the validation split is the last fraction of the tokens", "[data][attn]") {
  TempDir dir;
  const std::string path = dir.file("t.bin");
  data::build_token_file(path, small_corpus(dir));
  const TokenFile file(path);  // 14 tokens
  CHECK(file.validation_range(0.25).begin == 14 - 3);
  CHECK(file.validation_range(0.25).end == 14);
  CHECK(file.train_range(0.25).begin == 0);
  CHECK(file.train_range(0.25).end == 11);
  CHECK(file.validation_range(0.0).size() == 0);
  CHECK_THROWS_WITH(file.validation_range(1.0), Contains("must be in [0, 1)"));
  CHECK(file.tokens(file.validation_range(0.25)).size() == 3);
  CHECK_THROWS_WITH(file.tokens(data::TokenRange{5, 20}), Contains("outside its 14 tokens"));
}

TEST_CASE("unigram_entropy is the entropy of the token frequencies in nats", "[data][attn]") {
  const std::vector<uint16_t> uniform = {1, 2, 3, 4, 1, 2, 3, 4};
  CHECK(data::unigram_entropy(uniform) == Approx(std::log(4.0)));
  const std::vector<uint16_t> one = {7, 7, 7};
  CHECK(data::unigram_entropy(one) == 0.0);
  const std::vector<uint16_t> skewed = {0, 0, 0, 1};
  CHECK(data::unigram_entropy(skewed) == Approx(-(0.75 * std::log(0.75) + 0.25 * std::log(0.25))));
  CHECK(data::unigram_entropy({}) == 0.0);
}
