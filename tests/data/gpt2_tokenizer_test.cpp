// GPT-2's tokenizer on a hand-made vocabulary: the pre-token scanner against
// the pattern's meaning case by case, BPE's merge order, decoding, and the
// files' errors. Hugging Face's tokenizers checks it on real text in
// tests/data/check_gpt2_tokenizer.py.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/gpt2_tokenizer.hpp"
#include "loom/data/token_file.hpp"
#include "temp_dir.hpp"

using Catch::Matchers::Contains;
using loom::data::gpt2_pre_tokens;
using loom::data::Gpt2Tokenizer;
using loom::test::TempDir;

namespace {

std::vector<std::string> pre_tokens(const std::string& text) {
  std::vector<std::string> out;
  for (const auto piece : gpt2_pre_tokens(text)) out.emplace_back(piece);
  return out;
}

// Byte b written in GPT-2's byte alphabet, as UTF-8 (written here from the
// definition, independently of the library's table).
std::string alphabet_character(int b) {
  int code = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    int n = 0;
    for (int c = 0; c < b; ++c) {
      if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) ++n;
    }
    code = 256 + n;
  }
  std::string out;
  if (code < 0x80) {
    out.push_back(static_cast<char>(code));
  } else {
    out.push_back(static_cast<char>(0xC0 | (code >> 6)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
  return out;
}

std::string in_alphabet(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) out += alphabet_character(static_cast<unsigned char>(c));
  return out;
}

// A vocabulary of the 256 bytes (ids 0..255 in byte order), then the merges'
// results in merge order, then <|endoftext|>; the merges as byte strings.
struct Files {
  std::string vocab;
  std::string merges;
};

Files byte_level_files(const std::vector<std::pair<std::string, std::string>>& merges,
                       bool with_end_of_text = true) {
  Files files;
  files.vocab = "{";
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    std::string key = in_alphabet(std::string(1, static_cast<char>(b)));
    if (key == "\"" || key == "\\") key = "\\" + key;
    files.vocab += (b ? ", \"" : "\"") + key + "\": " + std::to_string(id++);
  }
  files.merges = "#version: 0.2\n";
  for (const auto& [left, right] : merges) {
    files.vocab += ", \"" + in_alphabet(left + right) + "\": " + std::to_string(id++);
    files.merges += in_alphabet(left) + " " + in_alphabet(right) + "\n";
  }
  if (with_end_of_text) files.vocab += ", \"<|endoftext|>\": " + std::to_string(id++);
  files.vocab += "}";
  return files;
}

Gpt2Tokenizer tokenizer_of(const TempDir& dir, const Files& files) {
  dir.write("tok/vocab.json", files.vocab);
  dir.write("tok/merges.txt", files.merges);
  return Gpt2Tokenizer::from_directory(dir.path() / "tok");
}

std::vector<std::string> token_strings(const Gpt2Tokenizer& tokenizer, const std::string& text) {
  std::vector<std::string> out;
  for (const int32_t id : tokenizer.encode(text)) out.push_back(tokenizer.token_bytes(id));
  return out;
}

using Strings = std::vector<std::string>;

}  // namespace

TEST_CASE("GPT-2's pre-tokens follow its pattern", "[data][tokenizer]") {
  // Contractions are ASCII and case-sensitive; a lone apostrophe is "other".
  CHECK(pre_tokens("don't I'LL x's'") == Strings{"don", "'t", " I", "'", "LL", " x", "'s", "'"});
  CHECK(pre_tokens("we're they've I'm she'd we'll") ==
        Strings{"we", "'re", " they", "'ve", " I", "'m", " she", "'d", " we", "'ll"});
  CHECK(pre_tokens("'''s") == Strings{"'''", "s"});
  // One space joins the next word, number or punctuation run; the rest of a
  // run of white space stays apart; a run at the end stays whole.
  CHECK(pre_tokens("hello, world!!  ok") == Strings{"hello", ",", " world", "!!", " ", " ok"});
  CHECK(pre_tokens("x \n\n y") == Strings{"x", " \n\n", " y"});
  CHECK(pre_tokens("a  \tb") == Strings{"a", "  ", "\t", "b"});
  CHECK(pre_tokens("a  ") == Strings{"a", "  "});
  CHECK(pre_tokens("\nb") == Strings{"\n", "b"});
  CHECK(pre_tokens("abc123 4.5") == Strings{"abc", "123", " 4", ".", "5"});
  // Unicode classes: letters of every script, numbers of every kind (Nd, Nl,
  // No), combining marks are "other", U+00A0 and U+2028 are white space,
  // U+001C is not.
  CHECK(pre_tokens("\xe2\x85\xab\xc2\xbd\xd9\xa3 12") ==  // Ⅻ½٣ 12
        Strings{"\xe2\x85\xab\xc2\xbd\xd9\xa3", " 12"});
  CHECK(pre_tokens("\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87") ==
        Strings{"\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8", "\xe0\xa5\x8d", "\xe0\xa4\xa4",
                "\xe0\xa5\x87"});  // नमस्ते
  CHECK(pre_tokens("a\xc2\xa0"
                   "b") == Strings{"a", "\xc2\xa0", "b"});
  CHECK(pre_tokens("a\xe2\x80\xa8\xe2\x80\xa8"
                   "b") == Strings{"a", "\xe2\x80\xa8", "\xe2\x80\xa8", "b"});
  CHECK(pre_tokens("a\x1c\x1d"
                   "b") == Strings{"a", "\x1c\x1d", "b"});
  CHECK(
      pre_tokens(" \xce\xba\xce\xb1\xce\xbb\xce\xb7\xce\xbc\xce\xad\xcf\x81\xce\xb1") ==
      Strings{" \xce\xba\xce\xb1\xce\xbb\xce\xb7\xce\xbc\xce\xad\xcf\x81\xce\xb1"});  // " καλημέρα"
  // Bytes that are not UTF-8 are "other" characters, one byte each.
  CHECK(pre_tokens("a\xff\xfe"
                   "b") == Strings{"a", "\xff\xfe", "b"});
  CHECK(pre_tokens(" \xff"
                   "x") == Strings{" \xff", "x"});
  CHECK(pre_tokens("\xe2\x82") == Strings{"\xe2\x82"});  // cut short
  CHECK(pre_tokens("\xc0\xaf"
                   "a") == Strings{"\xc0\xaf", "a"});  // overlong '/'
  CHECK(pre_tokens("\xed\xa0\x80"
                   "a") == Strings{"\xed\xa0\x80", "a"});  // a surrogate
  CHECK(pre_tokens("").empty());
}

TEST_CASE("GPT-2's pre-tokens cover any bytes exactly, in order", "[data][tokenizer]") {
  std::mt19937 random(7);
  const std::string alphabet = std::string("ab1 '\n\t.,s") + "\xc3\xa9\xe2\x80\xa8\xff\x80";
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    const int length = static_cast<int>(random() % 24);
    for (int i = 0; i < length; ++i) text.push_back(alphabet[random() % alphabet.size()]);
    std::string joined;
    for (const auto piece : gpt2_pre_tokens(text)) {
      REQUIRE(!piece.empty());
      joined += piece;
    }
    REQUIRE(joined == text);
  }
}

TEST_CASE("BPE merges the highest-priority pair first, each occurrence left to right",
          "[data][tokenizer]") {
  TempDir dir;
  const Gpt2Tokenizer tokenizer = tokenizer_of(dir, byte_level_files({{"h", "e"},
                                                                      {"l", "l"},
                                                                      {" ", "w"},
                                                                      {"o", "r"},
                                                                      {"he", "ll"},
                                                                      {"hell", "o"},
                                                                      {"b", "c"},
                                                                      {"a", "b"},
                                                                      {"a", "a"}}));
  CHECK(tokenizer.vocab_size() == 256 + 9 + 1);
  CHECK(tokenizer.merge_count() == 9);
  REQUIRE(tokenizer.end_of_text() == 256 + 9);
  CHECK(token_strings(tokenizer, "hello world") == Strings{"hello", " w", "or", "l", "d"});
  CHECK(tokenizer.encode("hello") == std::vector<int32_t>{256 + 5});
  // (b, c) comes before (a, b): "abc" is a + bc, not ab + c.
  CHECK(token_strings(tokenizer, "abc") == Strings{"a", "bc"});
  CHECK(token_strings(tokenizer, "aaa") == Strings{"aa", "a"});
  CHECK(token_strings(tokenizer, "aaaa") == Strings{"aa", "aa"});
  // Merges never cross pre-tokens: " w" merges, "\nw" does not.
  CHECK(token_strings(tokenizer, "\nw") == Strings{"\n", "w"});
  // The special token's text is ordinary text.
  CHECK(tokenizer.encode("<|endoftext|>").size() > 1);
  CHECK(tokenizer.token_bytes(256 + 9) == "<|endoftext|>");

  std::mt19937 random(11);
  for (int round = 0; round < 500; ++round) {
    std::string text;
    const int length = static_cast<int>(random() % 40);
    for (int i = 0; i < length; ++i) text.push_back(static_cast<char>(random() % 256));
    REQUIRE(tokenizer.decode(tokenizer.encode(text)) == text);
  }
  CHECK_THROWS_WITH(tokenizer.decode(std::vector<int32_t>{266}),
                    Contains("token id 266 is not in the vocabulary (266 ids)"));
  CHECK_THROWS_WITH(tokenizer.decode(std::vector<int32_t>{-1}), Contains("token id -1"));
}

TEST_CASE("OpenAI's file names are read too, and a folder without either pair is refused",
          "[data][tokenizer]") {
  TempDir dir;
  const Files files = byte_level_files({{"a", "b"}});
  dir.write("openai/encoder.json", files.vocab);
  dir.write("openai/vocab.bpe", files.merges);
  const Gpt2Tokenizer tokenizer = Gpt2Tokenizer::from_directory(dir.path() / "openai");
  CHECK(tokenizer.encode("ab") == std::vector<int32_t>{256});

  dir.write("empty/readme.txt", "");
  CHECK_THROWS_WITH(Gpt2Tokenizer::from_directory(dir.path() / "empty"),
                    Contains("expected vocab.json and merges.txt (Hugging Face) or encoder.json "
                             "and vocab.bpe (OpenAI) in it"));
  dir.write("half/encoder.json", files.vocab);
  CHECK_THROWS_WITH(Gpt2Tokenizer::from_directory(dir.path() / "half"),
                    Contains("has encoder.json but no vocab.bpe beside it"));
}

TEST_CASE(
    "a tokenizer's damaged files are refused naming the file, the token or line, and the "
    "rule",
    "[data][tokenizer]") {
  TempDir dir;
  const Files good = byte_level_files({{"a", "b"}});
  const auto refused = [&](const std::string& vocab, const std::string& merges) {
    dir.write("bad/vocab.json", vocab);
    dir.write("bad/merges.txt", merges);
    try {
      Gpt2Tokenizer(dir.path() / "bad/vocab.json", dir.path() / "bad/merges.txt");
    } catch (const loom::Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string body = good.vocab.substr(0, good.vocab.size() - 1);  // without '}'
  CHECK_THAT(refused("[1, 2]", good.merges),
             Contains("expected a JSON object of token -> id, got array"));
  CHECK_THAT(refused("{\"a\": ", good.merges), Contains("vocab.json: not JSON"));
  CHECK_THAT(refused(body + ", \"\xc8\x80\": 300}", good.merges),
             Contains("character U+200 at byte 0 is outside GPT-2's byte alphabet"));
  CHECK_THAT(refused(body + ", \"zz\": 3}", good.merges),
             Contains(": id 3 already belongs to token") && Contains("ids must be unique"));
  CHECK_THAT(refused(body + ", \"zz\": -4}", good.merges),
             Contains("token \"zz\": id -4 is not an integer"));
  CHECK_THAT(refused("{\"a\": 0}", ""),
             Contains("byte 0x0 has no token of its own; byte-level BPE needs one for each of "
                      "the 256 bytes"));
  CHECK_THAT(refused(good.vocab, "#version: 0.2\na b\nab\n"),
             Contains("merges.txt: line 3 \"ab\": expected two tokens separated by one space"));
  CHECK_THAT(refused(good.vocab, "a b\nb c\n"),
             Contains("line 2 \"b c\": the merged token is not in the vocabulary"));
  CHECK_THAT(refused(good.vocab, "a \xc8\x80\n"), Contains("line 1"));
  CHECK_THAT(refused(good.vocab, "a b\n"), Contains("(accepted)"));
}

TEST_CASE("token files of any vocabulary and llm.c's are written whole and read back",
          "[data][tokenizer]") {
  TempDir dir;
  const std::vector<uint16_t> tokens = {50256, 15496, 11, 995, 0};
  loom::data::write_llmc_token_file(dir.file("a.bin"), tokens);
  const loom::data::TokenFile llmc(dir.file("a.bin"));
  CHECK(llmc.from_llmc());
  CHECK(std::vector<uint16_t>(llmc.tokens().begin(), llmc.tokens().end()) == tokens);

  loom::data::write_token_file(dir.file("b.bin"), tokens, 50257);
  const loom::data::TokenFile loom_file(dir.file("b.bin"));
  CHECK_FALSE(loom_file.from_llmc());
  CHECK(loom_file.vocab_size() == 50257);
  CHECK(std::vector<uint16_t>(loom_file.tokens().begin(), loom_file.tokens().end()) == tokens);

  CHECK_THROWS_WITH(loom::data::write_token_file(dir.file("c.bin"), tokens, 1000),
                    Contains("token 0 is 50256, not below the vocab size 1000; nothing written"));
  CHECK_THROWS_WITH(
      loom::data::write_llmc_token_file(dir.file("c.bin"), std::vector<uint16_t>{60000}),
      Contains("not below the vocab size 50257"));
  CHECK_FALSE(std::filesystem::exists(dir.file("c.bin")));
}

TEST_CASE(
    "randomly damaged tokenizer files load or are refused cleanly, and what loads "
    "round-trips",
    "[data][tokenizer]") {
  TempDir dir;
  const Files good = byte_level_files({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "w"}});
  std::mt19937 random(2026);
  int refused = 0, loaded = 0;
  for (int round = 0; round < 400; ++round) {
    Files damaged = good;
    std::string& target = round % 2 ? damaged.vocab : damaged.merges;
    const int edits = 1 + static_cast<int>(random() % 4);
    for (int e = 0; e < edits && !target.empty(); ++e) {
      const size_t at = random() % target.size();
      switch (random() % 3) {
        case 0:
          target[at] = static_cast<char>(random() % 256);
          break;
        case 1:
          target.erase(at, 1 + random() % 8);
          break;
        default:
          target.resize(at);
          break;
      }
    }
    dir.write("fuzz/vocab.json", damaged.vocab);
    dir.write("fuzz/merges.txt", damaged.merges);
    try {
      const Gpt2Tokenizer tokenizer(dir.path() / "fuzz/vocab.json", dir.path() / "fuzz/merges.txt");
      const std::string text = "hello world\n\xff\xfe wall";
      REQUIRE(tokenizer.decode(tokenizer.encode(text)) == text);
      ++loaded;
    } catch (const loom::Error&) {
      ++refused;
    }
  }
  CHECK(refused > 100);
  CHECK(loaded + refused == 400);
}
