// Token files: a tokenised corpus on disk, memory-mapped for training.
//
// Format (little-endian), a 32-byte header then the tokens:
//
//   offset  0  magic        8 bytes  "LOOMTOK\0"
//   offset  8  version      u32      1
//   offset 12  vocab_size   u32      every token is < vocab_size
//   offset 16  token_count  u64
//   offset 24  dtype        u32      1 = uint16 tokens
//   offset 28  reserved     u32      0
//   offset 32  tokens       token_count x u16
//
// TokenFile also reads llm.c's token files (its dev/data scripts' .bin files
// of GPT-2 tokens): a header of 256 little-endian int32 (magic 20240520,
// version 1, the token count, then zeros), then the tokens as uint16; their
// vocabulary is GPT-2's, 50257 tokens.
//
// build_token_file() and the writers below write the file atomically: a
// temporary file in the same directory, fsync'd, then renamed over the target
// (and the directory fsync'd). A failed or interrupted build leaves no
// partial file under the target name, and ranks that build the same file at
// once each rename a complete copy. TokenFile validates the header and the size against the
// file's length before anything reads a token, and throws loom::Error naming
// the path and the mismatch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/data/text_corpus.hpp"

namespace loom::data {

inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr uint32_t kTokenDTypeU16 = 1;
inline constexpr uint64_t kTokenFileHeaderBytes = 32;
inline constexpr int32_t kLlmcMagic = 20240520;  // llm.c's token files
inline constexpr uint64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);
inline constexpr uint32_t kGpt2VocabSize = 50257;

struct TokenFileOptions {
  TextCorpusOptions corpus = {};
};

// What a build wrote.
struct TokenFileSummary {
  uint64_t documents = 0;
  uint64_t corpus_bytes = 0;
  uint64_t tokens = 0;  // corpus_bytes + documents (one end marker each)
};

// Tokenises the corpus byte-level (text_corpus.hpp) into `output_path`.
TokenFileSummary build_token_file(const std::string& output_path,
                                  const TokenFileOptions& options = {});

// Writes `tokens` to `path` in Loom's format with `vocab_size` in the header
// (1 to 65536, every token below it), atomically.
void write_token_file(const std::string& path, std::span<const uint16_t> tokens,
                      uint32_t vocab_size);
// Writes `tokens` to `path` as llm.c's token file (GPT-2 tokens: every token
// below 50257), atomically.
void write_llmc_token_file(const std::string& path, std::span<const uint16_t> tokens);

// Builds `path` unless it already exists; returns true if it built it. An
// existing file is validated (a corrupt one throws, naming the path: delete
// it to rebuild), never silently replaced.
bool ensure_token_file(const std::string& path, const TokenFileOptions& options = {});

// The token files a command-line argument names: `pattern` itself, or where
// it holds a glob wildcard (*, ?, [) every file it matches, sorted (llm.c's
// shards: "fineweb_train_*.bin"). Throws naming the pattern when nothing
// matches.
std::vector<std::string> token_file_paths(const std::string& pattern);

// A half-open range of token positions [begin, end).
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// A read-only memory map of a token file. Cheap to share (shared_ptr); the
// mapping lives as long as the TokenFile.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t vocab_size() const { return vocab_size_; }
  // Whether the file is llm.c's (GPT-2 tokens) rather than Loom's own.
  bool from_llmc() const { return from_llmc_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  // The mapped tokens (valid while this object lives).
  std::span<const uint16_t> tokens() const { return tokens_; }
  std::span<const uint16_t> tokens(TokenRange range) const;

  // The last `validation_fraction` of the tokens (rounded down) is the
  // validation split, the rest the training split. 0 <= fraction < 1.
  TokenRange train_range(double validation_fraction = 0.05) const;
  TokenRange validation_range(double validation_fraction = 0.05) const;

 private:
  void map_llmc(uint64_t file_bytes);
  // The tokens: `count` uint16 at byte `offset` of the mapping, each checked
  // below `vocab_size`.
  void set_tokens(uint64_t offset, uint64_t count, uint32_t vocab_size);

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  uint32_t vocab_size_ = 0;
  bool from_llmc_ = false;
  std::span<const uint16_t> tokens_;
};

// The entropy, in nats, of the token frequencies in `tokens`: the mean loss
// per token of a model that knows only how often each token occurs (and
// predicts that distribution at every position). A language model's
// validation loss should fall well below it.
double unigram_entropy(std::span<const uint16_t> tokens);

}  // namespace loom::data
